"""Opening a sqlite database that other processes may be opening, or creating, at the
same moment: the MLflow store (``sqlite:///mlflow.db``) and the Optuna study beside it
(``mlflow.optuna.db``).

MLflow and Optuna create their schema in place, on first use, with no lock between
processes: several opening one new database at once can die (``table ... already exists``)
or leave it half-migrated for good, which no later process can open. So a database this
tool creates is never built in place (``build_once``, under ``creation_lock``), and one that
another program is building in place is waited for (``wait_while_built``).

All of this rests on POSIX locks and an atomic link on a local file system. On NFS, EFS or
SMB sqlite's own locking is not reliable: use an MLflow server with a database behind it
(README, "Sharing a store").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pathlib
import secrets
import sqlite3
import time
from typing import Callable, Iterator, Optional

from accelsweep.sweeps.driver.record.secrets import redact_uri
from accelsweep.trainables.errors import ConfigError

__all__ = ["CREATION_RACE_SIGNS", "LOCK_SUFFIX", "SETTLE_S", "WAIT_S", "build_once", "create_optuna_storage",
           "creation_lock", "looks_like_creation_race", "open_experiment", "open_mlflow_client", "schema_revision",
           "sqlite_file", "wait_while_built"]

LOCK_SUFFIX = ".lock"
# A schema being built by another process changes every few seconds at most: a whole MLflow
# schema (create_all, then some 60 alembic steps) takes seconds even on loaded cores. Nothing
# changing for a few times that means nobody is building it.
SETTLE_S = 15.0
# The longest a sweep waits for another process's build (or for our own lock): a build that
# takes longer is stuck, and the message says what to do.
WAIT_S = 120.0
POLL_S = 0.2
# What MLflow and Optuna raise when another process built (part of) the schema meanwhile.
# (Not MLflow's "out-of-date database schema": a store of an older MLflow, whose message
# says to run `mlflow db upgrade`.)
CREATION_RACE_SIGNS = ("already exists", "duplicate column", "expected to match one row", "_alembic_tmp_",
                       "UNIQUE constraint failed: alembic_version", "no such table", "database is locked")


def sqlite_file(url: str) -> Optional[str]:
    """The absolute path of a ``sqlite:///<path>`` database URL; None for any other URL
    (another database, or sqlite in memory)."""
    if not isinstance(url, str) or not url.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        database = make_url(url).database
    except (ArgumentError, ValueError):
        return None
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return os.path.abspath(os.path.expanduser(database))


def looks_like_creation_race(error: BaseException) -> bool:
    text = str(error)
    return any(sign in text for sign in CREATION_RACE_SIGNS)


@contextlib.contextmanager
def creation_lock(path: str, wait_s: float = WAIT_S) -> Iterator[None]:
    """An exclusive lock on ``<path>.lock`` for creating or opening the database at
    ``path``, shared by every process of this tool on this machine, so two sweeps starting
    together build it once. Where no lock can be
    taken (a file system without POSIX locks: ENOLCK), the build is still atomic (the link):
    it goes on without one."""
    try:
        descriptor = os.open(path + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a folder we cannot write: the store checks refuse it before this runs
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has held {path + LOCK_SUFFIX} for over {wait_s:g} s "
                                       "while opening the same database; is one stuck?") from None
                time.sleep(POLL_S)
            except OSError as error:
                if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    break
                raise
        yield
    finally:
        os.close(descriptor)  # releases the lock; the file stays (removing it would race)


def build_once(path: str, build: Callable[[str], None]) -> bool:
    """Create the database at ``path`` unless it exists: ``build(temporary_path)`` builds it
    whole beside it, then it is linked into place in one step (``os.link`` fails when the
    path exists: whichever process links first wins). False when ``path`` existed, or
    another process linked its own first (then ours is dropped and the winner's opened)."""
    if os.path.exists(path):
        return False
    directory, name = os.path.split(path)
    # Made as sqlite makes a new file (0o666 less the umask), not mkstemp's 0o600.
    temporary = os.path.join(directory, f".{name}.creating-{os.getpid()}-{secrets.token_hex(4)}")
    os.close(os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666))  # an empty file: an empty database
    try:
        build(temporary)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV):
                raise
            # A file system without hard links (some FUSE mounts): rename, which would replace
            # a database another process created in the instant since the check.
            if os.path.exists(path):
                return False
            os.replace(temporary, path)
        return True
    finally:
        for leftover in (temporary, temporary + "-journal", temporary + "-wal", temporary + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(leftover)


def schema_revision(path: str) -> tuple[Optional[str], frozenset]:
    """The database's alembic revision (None: none recorded yet) and its table names, read
    without changing it; raises sqlite3.Error for a file that is not (yet) readable as a database.
    Opened read-write (``mode=rw`` never creates the file): a hot journal left by a writer that
    was killed mid-transaction must be rolled back before anyone can read, and a read-only
    connection cannot ("attempt to write a readonly database")."""
    uri = pathlib.Path(path).as_uri() + "?mode=rw"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as connection:
        tables = frozenset(row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'"))
        revision = None
        if "alembic_version" in tables:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = row[0] if row else None
    return revision, tables


def wait_while_built(path: str, complete: Callable[[Optional[str]], bool], settle_s: float = SETTLE_S,
                     wait_s: float = WAIT_S) -> bool:
    """Wait while another process builds the database at ``path``: until ``complete(its
    revision)``, or until nothing in it has changed for ``settle_s``. True when complete.
    A process outside our control (``mlflow ui``, a script calling ``mlflow.search_runs``)
    that opens a path that does not exist yet builds it in place; a database that settles
    incomplete is opened as it is, and what is wrong with it said."""
    started = last_change = time.monotonic()
    seen = None
    while True:
        try:
            stat = os.stat(path)
            if seen is None and time.time() - stat.st_mtime >= settle_s:
                return False  # untouched for a while: nobody is building it (a store of an older MLflow, ...)
            revision, tables = schema_revision(path)
            state = (stat.st_size, stat.st_mtime_ns, revision, tables)
        except FileNotFoundError:
            return False
        except sqlite3.Error as error:
            if "locked" not in str(error):
                return False  # not a database (yet, or ever): opening it says which
            revision, state = None, ("locked by its builder", stat.st_size, stat.st_mtime_ns)
        if revision is not None and complete(revision) and not any(t.startswith("_alembic_tmp_")
                                                                   for t in state[3]):
            return True
        now = time.monotonic()
        if state != seen:
            seen, last_change = state, now
        if now - last_change >= settle_s or now - started >= wait_s:
            return False
        time.sleep(POLL_S)


# Empty schemas built once per library version and copied for each new database: MLflow's
# create_all plus some 60 alembic steps (and Optuna's build) cost seconds, a copy milliseconds.
# A copy is the same file the build makes: tables, indexes and the alembic stamp, no rows
# (MLflow adds its Default experiment when a client first opens the store).
SCHEMA_CACHE_ENV = "ACCELSWEEP_SCHEMA_CACHE"


def schema_cache_dir() -> str:
    """$ACCELSWEEP_SCHEMA_CACHE, else $XDG_CACHE_HOME/accelsweep/schemas, else
    ~/.cache/accelsweep/schemas."""
    if os.environ.get(SCHEMA_CACHE_ENV):
        return os.environ[SCHEMA_CACHE_ENV]
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "accelsweep", "schemas")


def cached_build(name: str, build: Callable[[str], None], complete: Callable[[Optional[str]], bool]
                 ) -> Callable[[str], None]:
    """``build`` made once: the first database it builds is kept in the schema cache as
    ``name`` (a library's name, version and schema revision), later ones are copies of it.
    A cached file whose schema is not ``complete`` (its alembic revision) is built again;
    a cache that cannot be written leaves every build to ``build``."""
    import shutil

    cached = os.path.join(schema_cache_dir(), f"{name}.db")

    def build_or_copy(temporary: str) -> None:
        with contextlib.suppress(OSError, sqlite3.Error):
            if complete(schema_revision(cached)[0]):
                shutil.copyfile(cached, temporary)
                return
        build(temporary)
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            keeping = f"{cached}.{os.getpid()}-{secrets.token_hex(4)}"
            shutil.copyfile(temporary, keeping)
            os.replace(keeping, cached)  # whole or not at all: another process may be copying it

    return build_or_copy


def open_mlflow_client(tracking_uri: str, attempts: int = 3):
    """An MlflowClient on ``tracking_uri``; a sqlite store is created whole (above), or
    waited for while another process creates it. Raises what MLflow raises when it still
    cannot open the store after ``attempts`` (the caller says it as bad input)."""
    from mlflow.tracking import MlflowClient

    path = sqlite_file(tracking_uri)
    if path is None:
        return MlflowClient(tracking_uri=tracking_uri)
    from mlflow.store.db.utils import _get_latest_schema_revision, _initialize_tables, create_sqlalchemy_engine

    head = _get_latest_schema_revision()

    def build(temporary: str) -> None:
        engine = create_sqlalchemy_engine(f"sqlite:///{temporary}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()

    import mlflow

    complete = lambda revision: revision == head  # noqa: E731
    build = cached_build(f"mlflow-{mlflow.__version__}-{head}", build, complete)
    for attempt in range(1, attempts + 1):
        with creation_lock(path):
            if not build_once(path, build):
                wait_while_built(path, complete)
            try:
                return MlflowClient(tracking_uri=tracking_uri)
            except Exception as error:  # noqa: BLE001 - only a creation race is tried again
                if attempt == attempts or not looks_like_creation_race(error):
                    raise
        time.sleep(POLL_S * attempt)


def create_optuna_storage(url: str) -> None:
    """Create the Optuna database at a ``sqlite:///`` URL whole, unless it exists (waited
    for while another process creates it); other URLs are left to Optuna."""
    path = sqlite_file(url)
    if path is None:
        return

    import optuna

    def build(temporary: str) -> None:
        from optuna.storages import RDBStorage

        RDBStorage(f"sqlite:///{temporary}").engine.dispose()  # tables, version row, alembic stamp

    build = cached_build(f"optuna-{optuna.__version__}", build, lambda revision: revision is not None)
    with creation_lock(path):
        if not build_once(path, build):
            wait_while_built(path, lambda revision: True)  # stamped last: any revision is complete


def open_experiment(tracking_uri: str, experiment: str, artifact_location: Optional[str]):
    """An MlflowClient on ``tracking_uri`` and the id of ``experiment`` in it, created if
    new (another sweep creating the same one at the same moment is no error). A sqlite
    store MLflow still cannot open is bad input: ConfigError naming tracking_uri, with
    what MLflow said and what to do. Other stores' errors are the caller's to sort."""
    from mlflow.exceptions import MlflowException

    path = sqlite_file(tracking_uri)
    try:
        client = open_mlflow_client(tracking_uri)
    except Exception as error:  # noqa: BLE001 - a sqlite store's every failure is said the same way
        if path is None:
            raise
        said = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        hint = f"MLflow could not open {path}: {said}."
        if looks_like_creation_race(error):
            hint += (f" Another process was creating or upgrading it at the same moment and may have left it "
                     f"half-created; if it holds no runs yet, delete it (and {path + LOCK_SUFFIX}) and run again.")
        raise ConfigError("tracking_uri", "an MLflow sqlite store this MLflow can open", redact_uri(tracking_uri),
                          hint) from None
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return client, found.experiment_id
    try:
        return client, client.create_experiment(experiment, artifact_location=artifact_location)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client, client.get_experiment_by_name(experiment).experiment_id  # another sweep's, a moment ago
