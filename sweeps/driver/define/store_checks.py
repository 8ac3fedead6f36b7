"""Checks, made before anything starts (``plan.preflight``; --dry-run makes none of them),
that the places a sweep writes to can take its writes: the MLflow tracking store, the Optuna
study's database, and Tune's storage path. Each refusal is a ConfigError naming the field,
in seconds; without these checks a bad store costs minutes of MLflow's own retries and ends
in a traceback, and a full storage path fails at start and again on --resume.

- ``sqlite:///<path>``: a sqlite database (or empty, or absent) we can read and write, in a
  writable folder (sqlite writes its journal and lock beside the file) with MIN_FREE_BYTES;
- ``http(s)://``: MLflow's REST API answers one search of experiments (CONNECT_TIMEOUT_S);
- ``postgresql``, ``mysql``, ``mssql``: the port accepts a connection, then the database
  accepts ours through its driver (which MLflow needs installed too);
- ``databricks``: not checked (its workspace configuration is its SDK's); preflight says so;
- the storage path: it, or the nearest folder above it that exists, takes a file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import time
import threading
from typing import Any, Callable, Optional
from urllib.parse import urlsplit, urlunsplit

from accelsweep.trainables.errors import ConfigError
from accelsweep.sweeps.driver.record.database_errors import DRIVER_TIMEOUT_ARGS
from accelsweep.sweeps.driver.record.secrets import redact_uri, split_http_credentials
from accelsweep.sweeps.driver.record.sqlite_store import sqlite_file

__all__ = ["ANSWER_TIMEOUT_S", "CONNECT_TIMEOUT_S", "MIN_FREE_BYTES", "STORAGE_HINT", "STORAGE_PATH_VARIABLE",
           "TUNE_STORAGE_PATH", "check_storage_path", "check_study_storage", "check_tracking_store",
           "claim_experiment_dir", "default_storage_path", "free_bytes"]

# Where a sweep keeps Tune's state when --storage-path is not given: Tune's own folder,
# unless the environment names another (a cluster's shared disk, a CI job's scratch
# folder; the test suite keeps its sweeps out of the user's home with it).
STORAGE_PATH_VARIABLE = "ACCELSWEEP_STORAGE_PATH"
TUNE_STORAGE_PATH = "~/ray_results"  # Tune's own default (ray.train.constants.DEFAULT_STORAGE_PATH)
STORAGE_HINT = f"--storage-path; default ${STORAGE_PATH_VARIABLE}, else {TUNE_STORAGE_PATH}"


def default_storage_path() -> str:
    return os.environ.get(STORAGE_PATH_VARIABLE) or TUNE_STORAGE_PATH

# A TCP handshake: as preflight.CONNECT_TIMEOUT_S (a lost SYN is sent again after RFC
# 6298's 1 s and answered). An answer: one small query, which a healthy MLflow server or
# database returns in well under a second; 5 s covers a cold start. Whatever blocks
# outside those timeouts (a DNS lookup that hangs) is cut at PROBE_BOUND_S: every check
# ends in under 10 s.
CONNECT_TIMEOUT_S = 3.0
ANSWER_TIMEOUT_S = 5.0
PROBE_BOUND_S = 8.0
# What a sweep writes besides its trials' results: Tune's saved state, about 12 KB per
# trial (experiment state and the searcher's study), written again every 5 s beside the
# old copy; the MLflow writes kept while a tracking server is away (with copies of the
# reports and plots to log, a few MB); a sqlite store grows by about 40 KB per trial.
# 64 MiB holds all of it for a sweep of a thousand trials, and refuses a disk that is full
# or nearly so before a trial runs.
MIN_FREE_BYTES = 64 * 1024 * 1024
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
INSTALL_HINTS = {"postgresql": "pip install \"psycopg[binary]\" (SQLAlchemy 2.1's postgresql:// driver)", "mysql": "pip install pymysql",
                 "mssql": "pip install pyodbc (and an ODBC driver for SQL Server)"}
SQLITE_HEADER = b"SQLite format 3\x00"
# A server's reply whose body waits for the client's delayed ACK (Nagle's algorithm on the
# server's side: `mlflow server` on uvicorn with more than one worker, MLflow 3's default)
# is ~40 ms late on Linux; a reply on a new connection is not (its first ACK is at once).
STALLED_REPLY_S = 0.025
# uvicorn's options for an MLflow server with TCP_NODELAY on (the team store's: ops/server_protocol.py).
NODELAY_UVICORN_OPTS = "--http accelsweep.sweeps.driver.ops.server_protocol:NoDelayHTTPProtocol"


def _mib(count: int) -> str:
    return f"{count / 1024 / 1024:.0f} MiB"


def _bounded(probe: Callable[[], Any], seconds: float = PROBE_BOUND_S) -> Any:
    """``probe()``'s result or exception, or TimeoutError when it has not returned within
    ``seconds`` (it is left to finish in a daemon thread: nothing it holds is ours)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = probe()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            outcome["error"] = error

    thread = threading.Thread(target=run, name="accelsweep-store-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def free_bytes(folder: str) -> int:
    """Bytes an unprivileged writer may still write under ``folder``."""
    return shutil.disk_usage(folder).free


def _writable_folder(folder: str) -> Optional[str]:
    """Why ``folder`` takes no file (None: it does). A file is created and removed: the
    permission bits alone do not say (root passes them on a read-only mount)."""
    probe = os.path.join(folder, f".accelsweep-write-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        return f"{folder} takes no new file: {error.strerror or error}"
    try:
        os.write(descriptor, b"x")
    except OSError as error:
        return f"{folder} takes no data: {error.strerror or error}"
    finally:
        os.close(descriptor)
        try:
            os.remove(probe)
        except OSError:
            pass
    return None


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def check_storage_path(path: str, min_free: int = MIN_FREE_BYTES) -> None:
    """Refuse a storage path Tune could not save the sweep's state under: not a folder,
    read-only, or with less than ``min_free`` free. A path that does not exist yet is
    judged by the nearest folder above it (it is created when the sweep starts, not now)."""
    allowed = f"a writable folder with at least {_mib(min_free)} free ({STORAGE_HINT})"
    where = _nearest_existing(path)
    if not os.path.isdir(where):
        what = "is" if where == path else f"is under {where}, which is"
        raise ConfigError("storage_path", allowed, path, f"It {what} not a folder.")
    why = _writable_folder(where)
    if why is not None:
        raise ConfigError("storage_path", allowed, path,
                          f"{why}. Pass a --storage-path on a writable disk.")
    free = free_bytes(where)
    if free < min_free:
        raise ConfigError("storage_path", allowed, path,
                          f"{where} has {free / 1024 / 1024:.1f} MiB free: Tune saves the sweep's state there every "
                          "few seconds. Free some space, or pass a --storage-path on another disk.")


def check_sqlite_database(field: str, url: str, what: str) -> None:
    """A ``sqlite:///`` URL's file: a sqlite database (or empty) we can read and write, or
    absent in a writable folder with room; ``what`` names the database in messages."""
    path = sqlite_file(url)
    shown = redact_uri(url)
    allowed = f"sqlite:///<path> naming {what} (a sqlite file, or a new one in a writable folder)"
    if path is None:
        raise ConfigError(field, allowed, shown, "It names no file (sqlite in memory is lost with the process).")
    folder = os.path.dirname(path)
    if os.path.islink(path) and not os.path.exists(path):
        # sqlite would create the file the link names, or retry for minutes when it cannot.
        try:
            os.stat(path)
            why = "it cannot be followed"
        except OSError as error:
            why = ("it is a loop of links" if error.errno == errno.ELOOP else
                   f"it points to {os.readlink(path)!r}, which does not exist")
        raise ConfigError(field, allowed, shown, f"{path} is a symbolic link, but {why}. Mend or remove the link, "
                                                 "or name the database file itself.")
    if os.path.isdir(path):
        raise ConfigError(field, allowed, shown, f"{path} is a folder; name a file in it, e.g. "
                                                 f"sqlite:///{os.path.join(path, 'mlflow.db')}.")
    if os.path.exists(path):
        if not os.path.isfile(path):
            raise ConfigError(field, allowed, shown, f"{path} is not a regular file.")
        try:
            with open(path, "r+b") as database:  # r+: a read-only file or mount fails here, also for root
                header = database.read(len(SQLITE_HEADER))
        except OSError as error:
            raise ConfigError(field, allowed, shown, f"{path} cannot be opened for reading and writing: "
                                                     f"{error.strerror or error}.") from None
        if header and header != SQLITE_HEADER:  # empty: a database another process is creating now
            raise ConfigError(field, allowed, shown, f"{path} is not a sqlite database (it starts with "
                                                     f"{header[:16]!r}). Name another file, or move this one away.")
        if header:
            _check_not_locked(field, path, allowed, shown)
    if not os.path.isdir(folder):
        raise ConfigError(field, allowed, shown, f"Directory {folder!r} does not exist.")
    why = _writable_folder(folder)
    if why is not None:
        raise ConfigError(field, allowed, shown, f"{why}; sqlite writes its journal beside the database.")
    free = free_bytes(folder)
    if free < MIN_FREE_BYTES:
        raise ConfigError(field, allowed, shown, f"{folder} has {free / 1024 / 1024:.1f} MiB free, under the "
                                                 f"{_mib(MIN_FREE_BYTES)} a sweep needs.")


# A writer holds a sqlite database's write lock for milliseconds; one held this long is a
# process that keeps it (an open transaction, a stuck or suspended writer): sqlite would
# retry for tens of seconds at every write, then fail.
LOCK_WAIT_S = 5.0


def _check_not_locked(field: str, path: str, allowed: str, shown: str) -> None:
    """Refuse a database whose write lock another process holds past ``LOCK_WAIT_S``,
    naming the processes that have it open."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(path, timeout=LOCK_WAIT_S, isolation_level=None)) as database:
            database.execute("BEGIN IMMEDIATE")  # the write lock, taken and given back: nothing written
            database.execute("ROLLBACK")
    except sqlite3.OperationalError as error:
        if "locked" not in str(error) and "busy" not in str(error):
            return  # not a lock: what opens it says what is wrong, as before
        holders = ", ".join(f"pid {pid} ({command})" for pid, command in _processes_with_open(path)[:4])
        raise ConfigError(field, allowed, shown, f"{path} is locked: another process has held its write lock for "
                                                 f"{LOCK_WAIT_S:g} s ({holders or 'which one is not visible here'}). "
                                                 "End or wait for it, or name another file.") from None


def _processes_with_open(path: str) -> list[tuple[int, str]]:
    """The processes of this machine that have ``path`` open, as far as /proc shows them."""
    found = []
    real = os.path.realpath(path)
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()) if os.path.isdir("/proc") else ():
        if pid == os.getpid():
            continue
        try:
            if any(os.path.realpath(os.path.join(f"/proc/{pid}/fd", fd)) == real
                   for fd in os.listdir(f"/proc/{pid}/fd")):
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    command = " ".join(cmdline.read().replace(b"\0", b" ").decode(errors="replace").split())
                found.append((pid, redact_uri(command)[:80]))  # one line: a `python -c` program has many
        except OSError:
            continue
    return found


# A table each of MLflow's and Optuna's sqlite schemas has from their first migration on.
MLFLOW_TABLES, OPTUNA_TABLES = frozenset({"experiments", "runs"}), frozenset({"studies", "trials"})


def check_sqlite_is_ours(field: str, url: str, what: str, tables: frozenset) -> None:
    """An existing sqlite file with tables must be ``what`` (hold ``tables``): another
    application's database would get MLflow's (or Optuna's) tables added beside its own.
    Read read-only: the file is left as it was."""
    import sqlite3

    path = sqlite_file(url)
    if path is None or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)) as database:
            found = {name for (name,) in database.execute("select name from sqlite_master where type = 'table'")}
    except sqlite3.Error:
        return  # locked or unreadable: what opens it says so, as before
    if found and not tables <= found:
        shown = ", ".join(sorted(found)[:6]) + (", ..." if len(found) > 6 else "")
        raise ConfigError(field, f"a new sqlite file, or {what}", redact_uri(url),
                          f"{path} holds another application's tables ({shown}) and no {what}'s: a sweep would "
                          "add its tables beside them. Name another file.")


def check_tracking_store(uri: str) -> Optional[str]:
    """Refuse a tracking URI (syntax already checked: validate_tracking_uri) whose store
    cannot take a sweep's writes, in under 10 s. Returns a note for a store that could not
    be checked from here, else None."""
    scheme = urlsplit(uri).scheme.split("+", 1)[0]
    if scheme == "sqlite":
        check_sqlite_database("tracking_uri", uri, "the MLflow store")
        check_sqlite_is_ours("tracking_uri", uri, "an MLflow store", MLFLOW_TABLES)
    elif scheme in ("http", "https"):
        return _check_mlflow_server(uri)
    elif scheme in DEFAULT_PORTS:
        _check_database_server("tracking_uri", uri)
    else:
        return (f"note: tracking URI {redact_uri(uri)} is not checked before the sweep (a {scheme} workspace's "
                "configuration is its SDK's); MLflow checks it when the sweep opens its store")
    return None


def check_study_storage(url: str) -> None:
    """The Optuna study's database (--study-storage), as the tracking store's."""
    scheme = urlsplit(url).scheme.split("+", 1)[0]
    if scheme == "sqlite":
        check_sqlite_database("study_storage", url, "the Optuna study's database")
        check_sqlite_is_ours("study_storage", url, "an Optuna study database", OPTUNA_TABLES)
    elif scheme in DEFAULT_PORTS:
        _check_database_server("study_storage", url)


def _check_mlflow_server(uri: str) -> Optional[str]:
    """MLflow's REST API at ``uri`` answers one search of experiments, sent with the
    credentials MLflow would send, within CONNECT_TIMEOUT_S to connect and ANSWER_TIMEOUT_S
    to answer. Returns a note when its replies stall (``stalled_replies_note``)."""
    import requests

    parts = urlsplit(uri)
    shown = redact_uri(uri)
    allowed = "the address of an MLflow tracking server that answers"
    host = parts.hostname or ""
    netloc = host if ":" not in host else f"[{host}]"
    if parts.port:
        netloc += f":{parts.port}"
    endpoint = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/api/2.0/mlflow/experiments/search",
                           "max_results=1", ""))
    options: dict[str, Any] = {"timeout": (CONNECT_TIMEOUT_S, ANSWER_TIMEOUT_S), "allow_redirects": True}
    # The credentials MLflow sends (mlflow/utils/rest_utils.py): the URI's, else its variables,
    # else its own file, ~/.mlflow/credentials (read_mlflow_creds: what a team store's
    # mlflow-credentials is copied to). The URI's own are percent-encoded (p%40ss is p@ss):
    # split_http_credentials decodes them.
    from mlflow.utils.credentials import read_mlflow_creds

    _, uri_user, uri_password = split_http_credentials(uri)
    mlflow_creds = read_mlflow_creds()
    user = uri_user or mlflow_creds.username
    password = uri_password if uri_user else mlflow_creds.password
    if user is not None and password is not None:
        options["auth"] = (user, password)
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        options["headers"] = {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        options["verify"] = False
    elif os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
        options["verify"] = os.environ["MLFLOW_TRACKING_SERVER_CERT_PATH"]
    if os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
        options["cert"] = os.environ["MLFLOW_TRACKING_CLIENT_CERT_PATH"]
    shown_endpoint = redact_uri(endpoint)
    try:
        answer = _bounded(lambda: requests.get(endpoint, **options))
    except (requests.RequestException, OSError) as error:
        if isinstance(error, TimeoutError):
            said = f"no answer within {PROBE_BOUND_S:g} s"
        else:  # requests' own text quotes the whole request: its class says enough
            said = type(error).__name__ + (": connection refused" if "refused" in str(error).lower() else "")
        raise ConfigError("tracking_uri", allowed, shown,
                          f"Nothing answered at {shown_endpoint} ({said}; {CONNECT_TIMEOUT_S:g} s to connect, "
                          f"{ANSWER_TIMEOUT_S:g} s to answer). Is the server up (mlflow server ...) and its address "
                          "right?") from None
    status = answer.status_code
    if status in (401, 403):
        raise ConfigError("tracking_uri", allowed, shown,
                          f"The server refused our credentials (HTTP {status} for {shown_endpoint}): set "
                          "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), or put "
                          "user:password@ in the URI.")
    if status >= 500:
        # The server is there but failing: its own store (a database out of connections, down,
        # restarting) rather than a wrong address. MLflow's answer says which.
        raise ConfigError("tracking_uri", allowed, shown,
                          f"The server answered HTTP {status} for {shown_endpoint}: it is up but failing, most often "
                          f"because its backend store does not answer (its database down or out of connections). "
                          f"It said: {_answer_text(answer)}")
    if status != 200:
        raise ConfigError("tracking_uri", allowed, shown,
                          f"It answered HTTP {status} for {shown_endpoint}, not MLflow's REST API: is this the "
                          "server's root address (no path after host:port, unless it serves under a prefix)?")
    try:
        answer.json()
    except ValueError:
        raise ConfigError("tracking_uri", allowed, shown,
                          f"It answered {shown_endpoint} with something other than JSON: not an MLflow server?") \
            from None
    return stalled_replies_note(endpoint, options, shown)


def stalled_replies_note(endpoint: str, options: dict[str, Any], shown: str, tries: int = 3) -> Optional[str]:
    """A note when the server's replies on a kept-alive connection (as MLflow's client keeps
    one) come STALLED_REPLY_S or more later than on a new connection: each of a sweep's
    writes, three a trial, then waits that long for nothing. None when they do not, or
    when the probe itself fails (the check above has said what matters)."""
    import requests

    def timed(get) -> float:
        started = time.perf_counter()
        get(endpoint, **options)
        return time.perf_counter() - started

    def probe() -> tuple[float, float]:
        new = min(timed(requests.get) for _ in range(tries))
        with requests.Session() as session:
            session.get(endpoint, **options)  # the connection, kept
            kept = min(timed(session.get) for _ in range(tries))
        return new, kept

    try:
        new, kept = _bounded(probe)
    except (requests.RequestException, OSError):
        return None
    if kept - new < STALLED_REPLY_S:
        return None
    return (f"note: the MLflow server at {shown} answers a kept connection {kept * 1000:.0f} ms late, a new one in "
            f"{new * 1000:.0f} ms: its replies wait for the client's delayed ACK (TCP_NODELAY off on its side, as "
            "`mlflow server` on uvicorn with more than one worker), and each write of the sweep with them. Start it "
            f"with --uvicorn-opts '{NODELAY_UVICORN_OPTS}' (as `accelsweep team-store up` does), or with --workers 1")


def _answer_text(answer, limit: int = 300) -> str:
    """The first ``limit`` characters of an HTTP answer's body, on one line."""
    text = " ".join((answer.text or "").split())
    return (text[:limit] + "...") if len(text) > limit else (text or "(nothing)")


def _check_database_server(field: str, url: str) -> None:
    """A database server's port accepts a connection, then the database accepts ours."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = redact_uri(url)
    allowed = "a database server that accepts a connection from here"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(field, "an SQLAlchemy database URL (postgresql://user@host/db, ...)", shown) from None
    backend = parsed.get_backend_name()
    host, port = parsed.host or "localhost", parsed.port or DEFAULT_PORTS.get(backend)
    if port is not None and not host.startswith("/"):
        try:
            _bounded(lambda: socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close())
        except OSError as error:
            raise ConfigError(field, allowed, shown, f"Nothing answers at {host}:{port} within "
                                                     f"{CONNECT_TIMEOUT_S:g} s: {error}. Is the database up, and "
                                                     "its port open to this machine?") from None
    timeout_arg = DRIVER_TIMEOUT_ARGS.get(backend)
    try:
        engine = create_engine(url, connect_args={timeout_arg: int(CONNECT_TIMEOUT_S + ANSWER_TIMEOUT_S)}
                               if timeout_arg else {})
    except (ImportError, NoSuchModuleError) as error:
        raise ConfigError(field, allowed, shown, f"Its driver is not installed here ({error}); MLflow and Optuna "
                                                 f"need it: {INSTALL_HINTS.get(backend, 'install it')}.") from None

    def connect() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    try:
        _bounded(connect)
    except Exception as error:  # noqa: BLE001 - the driver's own classes: refused, unknown user, ...
        said = redact_uri(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
        raise ConfigError(field, allowed, shown, f"The database did not accept a connection: {said[:300]}") from None
    finally:
        engine.dispose()


def claim_experiment_dir(storage: str, name: str, host_names: Optional[str] = None) -> str:
    """``storage/name``, made now, or ``name-2``, ``-3``, ... when another sweep has it:
    two sweeps of one name started in the same second on one storage path would otherwise
    write one Tune experiment. ``host_names``: a folder where every driver on this host
    claims its experiment's name too (the Ray session's: ray_adapter.session_names_dir).
    Tune stages a driver's files in the Ray session's folder under the experiment's name
    and the second it started: two drivers on one cluster head, each with its own storage
    path, that started a sweep of one name in one second shared it, and each uploaded
    the other's trials and saved state into its own storage (seen with four drivers)."""
    os.makedirs(storage, exist_ok=True)
    if host_names is not None:
        os.makedirs(host_names, exist_ok=True)
    for suffix in range(1, 1000):
        candidate_name = name if suffix == 1 else f"{name}-{suffix}"
        candidate = os.path.join(storage, candidate_name)
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        except OSError as error:
            if error.errno in (errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EDQUOT):
                raise ConfigError("storage_path", f"a writable folder ({STORAGE_HINT})",
                                  storage, f"{candidate} could not be made: {error.strerror}.") from None
            raise
        if host_names is None:
            return candidate
        try:
            os.mkdir(os.path.join(host_names, candidate_name))
            return candidate
        except FileExistsError:  # another driver on this host has the name: both move on
            os.rmdir(candidate)
    raise RuntimeError(f"999 sweeps named {name}-* under {storage} already")
