"""What a database error means for a write that can wait: the study's database (or its
connection) was away, or it refused the write. Its own module: the callbacks, which hold
the waiting writes, and the study, which makes them, both ask it."""

from __future__ import annotations

__all__ = ["DRIVER_TIMEOUT_ARGS", "database_unanswered"]

# Drivers' own connect-timeout arguments (seconds), so a server that accepts TCP but never
# answers is given up on by the driver too.
DRIVER_TIMEOUT_ARGS = {"postgresql": "connect_timeout", "mysql": "connect_timeout", "mssql": "timeout"}


def database_unanswered(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it: Optuna wraps SQLAlchemy's errors) says the
    study's database could not be reached or gave no connection (down, restarting, out of
    connections, a lost connection, a busy sqlite file), rather than that it refused the
    write: only the first is worth writing again later."""
    from sqlalchemy import exc

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError, exc.TimeoutError)):
            return True
        if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
            return True
        error = error.__cause__ or error.__context__
    return False
