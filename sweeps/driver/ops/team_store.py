"""A team's shared record, started with one command: PostgreSQL, and an MLflow tracking
server on it that serves the artifacts too, plus a database for the Optuna studies.

    accelsweep team-store up                 # prints the flags and the one variable sweeps need
    export PGPASSFILE=~/.local/share/accelsweep/team-store/credentials
    accelsweep run neuron_vit --tracking-uri http://127.0.0.1:5000 \\
        --study-storage postgresql://accelsweep@127.0.0.1:5433/optuna
    accelsweep team-store status
    accelsweep team-store down

Everything runs from one folder (``--dir``), bound to ``--host`` (127.0.0.1 by default; a
cluster head's address for the cluster's hosts), with passwords generated here, never on a
command line (``up``). Connections are bounded by what opens them, not by the number of
trials (SERVER_CONNECTIONS, optuna_study.DRIVER_CONNECTIONS); trials never connect.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from accelsweep.sweeps.driver.define.store_checks import NODELAY_UVICORN_OPTS
from accelsweep.trainables.errors import ConfigError

DEFAULT_DIR = os.path.join(os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"),
                           "accelsweep", "team-store")
ROLE = "accelsweep"
DATABASES = ("mlflow", "optuna")
SERVER_WORKERS = 2
# uvicorn's HTTP protocol with TCP_NODELAY set: without it every request waits 40 ms (server_protocol.py).
UVICORN_OPTS = NODELAY_UVICORN_OPTS
POOL_SIZE, MAX_OVERFLOW = 4, 2  # each SQLAlchemy engine of the server (MLflow's variables)
# The engines an MLflow 3.17 server worker opens on its store: tracking, model registry,
# workspace, jobs, trace roll-up (mlflow/store/*/sqlalchemy_store.py). So the server holds
# at most SERVER_WORKERS x SERVER_ENGINES x (POOL_SIZE + MAX_OVERFLOW) = 60 connections,
# however many sweeps and trials write to it; few are open at once in practice.
SERVER_ENGINES = 5
SERVER_CONNECTIONS = SERVER_WORKERS * SERVER_ENGINES * (POOL_SIZE + MAX_OVERFLOW)
MAX_CONNECTIONS = 100  # PostgreSQL's max_connections: the hard limit
MLFLOW_USER = ROLE  # the MLflow server's admin user (basic auth)
START_TIMEOUT_S = 180.0  # the MLflow server's start takes tens of seconds on a small busy machine


@dataclass(frozen=True)
class TeamStore:
    folder: str
    host: str
    pg_port: int
    mlflow_port: int
    mlflow_pid: int = 0

    @property
    def tracking_uri(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    def database_uri(self, database: str) -> str:
        """A SQLAlchemy URL without the password: libpq takes it from PGPASSFILE."""
        return f"postgresql://{ROLE}@{self.host}:{self.pg_port}/{database}"

    @property
    def study_storage(self) -> str:
        return self.database_uri("optuna")

    @property
    def credentials(self) -> str:
        """libpq's password file for the role (PGPASSFILE)."""
        return os.path.join(self.folder, "credentials")

    @property
    def mlflow_credentials(self) -> str:
        """The MLflow server's user and password, as MLflow's ~/.mlflow/credentials has them."""
        return os.path.join(self.folder, "mlflow-credentials")

    def mlflow_login(self) -> tuple[str, str]:
        """(user, password) of the MLflow server: for a client's MLFLOW_TRACKING_USERNAME /
        MLFLOW_TRACKING_PASSWORD."""
        import configparser

        parser = configparser.ConfigParser()
        parser.read(self.mlflow_credentials)
        return parser["mlflow"]["mlflow_tracking_username"], parser["mlflow"]["mlflow_tracking_password"]


def _state_path(folder: str) -> str:
    return os.path.join(folder, "state.json")


def _bin(name: str) -> str:
    """A PostgreSQL server binary: on PATH, else Debian's versioned folder."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(os.listdir("/usr/lib/postgresql"), key=int) if os.path.isdir("/usr/lib/postgresql") else []
    for version in reversed(versions):
        candidate = f"/usr/lib/postgresql/{version}/bin/{name}"
        if os.path.exists(candidate):
            return candidate
    raise ConfigError("postgresql", "PostgreSQL's server programs (initdb, pg_ctl), e.g. apt install postgresql",
                      None, f"{name} is not on PATH nor under /usr/lib/postgresql/*/bin.")


def _as_server_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the ``postgres`` user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _check_reachable_by_server_user(folder: str) -> None:
    """As root the server runs as ``postgres``, which must pass through every folder above
    its data: refuse a folder it cannot reach, before anything starts."""
    if os.geteuid() != 0:
        return
    above = os.path.dirname(folder)
    while above and above != "/":
        if not os.stat(above).st_mode & 0o001:
            raise ConfigError("--dir", "a folder the postgres user can reach (every folder above it searchable by "
                                       "others, as /tmp or /srv are)", folder,
                              f"{above} is not (mode {oct(os.stat(above).st_mode & 0o777)}).")
        above = os.path.dirname(above)


def _give_to_server_user(*paths: str) -> None:
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        for path in paths:
            os.chown(path, user.pw_uid, user.pw_gid)


def up(folder: str = DEFAULT_DIR, host: str = "127.0.0.1", pg_port: int = 5433, mlflow_port: int = 5000,
       say=print) -> TeamStore:
    """Start PostgreSQL (initialised on first use) and the MLflow server; what sweeps need.

    - PostgreSQL from the machine's own server binaries (Debian's ``postgresql``): ``initdb``
      of a data directory in ``folder``, password auth (scram-sha-256) for every connection,
      TCP on ``host:pg_port`` only, its Unix socket inside the folder. Clients from loopback
      only, or with ``host`` another address, from that address's subnets (pg_hba
      ``samenet``). Run as the ``postgres`` user when started by root (PostgreSQL refuses
      root).
    - Two databases owned by one role, ``accelsweep``: ``mlflow`` (the tracking store) and
      ``optuna`` (every sweep's study).
    - An MLflow server on ``host:mlflow_port``, on the ``mlflow`` database, with
      ``--serve-artifacts`` (no host needs the artifact folder) and basic auth: every
      request but ``/health`` needs a user and password. Its users are in ``auth.db``, a
      sqlite file in the folder (it adds nothing to PostgreSQL's connections).

    The role's password is in ``credentials``, a libpq password file (0600) that libpq reads
    through ``PGPASSFILE``, so a URI without a password works for MLflow's server, for
    sweeps' ``--study-storage`` and for ``psql``. The MLflow admin's (``accelsweep``) is in
    ``mlflow-credentials`` (0600), in the format of MLflow's own ``~/.mlflow/credentials``;
    the server gets it through MLFLOW_AUTH_ADMIN_PASSWORD in its environment."""
    if read(folder) is not None:
        raise ConfigError("--dir", "a folder no running team store uses", folder,
                          "One is up there already (accelsweep team-store status; down stops it).")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError("--host", "an IP address of this machine (127.0.0.1, or a cluster head's)", host,
                          "Both servers bind it, and PostgreSQL takes clients from its subnets.") from None
    _check_reachable_by_server_user(os.path.abspath(folder))
    # Others may pass through it (the server user, when root starts it) but not list it;
    # what is secret in it is its own files' (credentials 0600, the data 0700).
    os.makedirs(folder, mode=0o711, exist_ok=True)
    os.chmod(folder, 0o711)
    store = TeamStore(os.path.abspath(folder), host, pg_port, mlflow_port)
    data, run = os.path.join(store.folder, "pgdata"), os.path.join(store.folder, "run")
    if not os.path.isdir(data):
        try:
            _initialise(store, data, run, say)
        except BaseException:
            shutil.rmtree(data, ignore_errors=True)  # half an initdb: the next up starts afresh
            raise
    _ensure_mlflow_credentials(store, say)
    start_postgres(store, say)
    store = _start_mlflow(store, say)
    _save(store)
    return store


def _save(store: TeamStore) -> None:
    with open(_state_path(store.folder), "w") as state_file:
        json.dump(asdict(store), state_file)


# What initdb allows over TCP is loopback only; a store bound to a cluster head's address
# must also take its hosts, and itself on that address (the MLflow server connects there).
# "samenet": any address of a subnet the server's machine is on, with a password still.
HBA_MARK = "# accelsweep team store: clients of the host's own subnets"
HBA_SAMENET = "host all all samenet scram-sha-256"


def allow_clients(data: str, host: str) -> None:
    """pg_hba.conf taking connections from the host's subnets when it is bound to an
    address other than loopback; loopback only otherwise (as initdb wrote it)."""
    path = os.path.join(data, "pg_hba.conf")
    with open(path) as hba:
        lines = [line for line in hba.read().splitlines() if line not in (HBA_MARK, HBA_SAMENET)]
    if not ipaddress.ip_address(host).is_loopback:
        lines += [HBA_MARK, HBA_SAMENET]
    with open(path, "w") as hba:
        hba.write("\n".join(lines) + "\n")


def start_postgres(store: TeamStore, say=print) -> None:
    """PostgreSQL on the store's data, port and host (waits until it accepts connections)."""
    data, run = os.path.join(store.folder, "pgdata"), os.path.join(store.folder, "run")
    allow_clients(data, store.host)
    started = time.monotonic()
    subprocess.run(_as_server_user([_bin("pg_ctl"), "-D", data, "-l", os.path.join(run, "postgres.log"), "-w",
                                    "-t", "60", "-o", f"-p {store.pg_port} -h {store.host} -k {run}", "start"]),
                   check=True, capture_output=True, text=True, timeout=90)
    say(f"postgresql: serving {store.host}:{store.pg_port} ({time.monotonic() - started:.1f} s), data in {data}")


def _ensure_mlflow_credentials(store: TeamStore, say) -> None:
    """The MLflow admin's password, generated once (a store made before basic auth gets one
    at its next up, with a new users' database)."""
    if os.path.exists(store.mlflow_credentials):
        return
    auth_db = os.path.join(store.folder, "auth.db")
    if os.path.exists(auth_db):  # its admin's password would not be this one
        os.remove(auth_db)
    with open(os.open(store.mlflow_credentials, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        # configparser's format, as MLflow reads ~/.mlflow/credentials (mlflow/utils/credentials.py)
        out.write(f"[mlflow]\nmlflow_tracking_username = {MLFLOW_USER}\n"
                  f"mlflow_tracking_password = {secrets.token_urlsafe(24)}\n")
    say(f"mlflow: user {MLFLOW_USER}, password in {store.mlflow_credentials} (0600)")


def _initialise(store: TeamStore, data: str, run: str, say) -> None:
    """initdb, the role and its databases, the credentials file."""
    os.makedirs(run, mode=0o700, exist_ok=True)
    superuser_password, role_password = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    password_file = os.path.join(run, "initdb-password")
    with open(os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(superuser_password + "\n")
    os.makedirs(data, mode=0o700)
    _give_to_server_user(data, run, password_file)
    try:
        subprocess.run(_as_server_user([_bin("initdb"), "-D", data, "-U", "postgres", "--auth=scram-sha-256",
                                        f"--pwfile={password_file}", "--encoding=UTF8", "--no-instructions"]),
                       check=True, capture_output=True, text=True, timeout=120)
    finally:
        os.remove(password_file)
    with open(os.path.join(data, "postgresql.conf"), "a") as conf:
        conf.write(f"\n# accelsweep team store\nmax_connections = {MAX_CONNECTIONS}\n")
    allow_clients(data, store.host)
    with open(os.open(store.credentials, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        # libpq's password file: host:port:database:user:password
        out.write(f"{store.host}:{store.pg_port}:*:{ROLE}:{role_password}\n")
    subprocess.run(_as_server_user([_bin("pg_ctl"), "-D", data, "-l", os.path.join(run, "postgres.log"), "-w",
                                    "-o", f"-p {store.pg_port} -h {store.host} -k {run}", "start"]),
                   check=True, capture_output=True, text=True, timeout=90)
    try:
        import psycopg
        from psycopg import sql

        with psycopg.connect(host=store.host, port=store.pg_port, user="postgres", password=superuser_password,
                             dbname="postgres", autocommit=True) as connection:
            # A role's password is a literal in CREATE ROLE, not a bind parameter: quoted by psycopg.
            connection.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(ROLE), sql.Literal(role_password)))
            for database in DATABASES:
                connection.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(database), sql.Identifier(ROLE)))
    finally:
        subprocess.run(_as_server_user([_bin("pg_ctl"), "-D", data, "-w", "stop"]), capture_output=True, timeout=90)
    say(f"postgresql: initialised {data}: role {ROLE}, databases {', '.join(DATABASES)}; "
        f"password in {store.credentials} (0600)")


# MLflow checks a request's login twice (its user, then whether an admin), each a
# password check and queries of the users' database: a tenth of the server's CPU for a
# sweep's small writes. Its cache of logins that passed (off by default) skips them; a
# password changed or a user removed reaches each server worker within this time.
AUTH_CACHE_TTL_S = 60


def _auth_config(store: TeamStore) -> str:
    """MLflow's basic-auth configuration (no secret in it: the admin's password goes in
    the server's environment). Authenticated users may read every experiment; what they
    create is theirs to edit (MLflow's default); the admin may do everything."""
    path = os.path.join(store.folder, "basic_auth.ini")
    with open(path, "w") as out:
        out.write("[mlflow]\ndefault_permission = READ\n"
                  f"database_uri = sqlite:///{os.path.join(store.folder, 'auth.db')}\n"
                  f"admin_username = {MLFLOW_USER}\n"
                  "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                  f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_S}\n")
    return path


def _start_mlflow(store: TeamStore, say, stop_postgres_on_failure: bool = True) -> TeamStore:
    artifacts = os.path.join(store.folder, "artifacts")
    os.makedirs(artifacts, exist_ok=True)
    _, admin_password = store.mlflow_login()
    env = {**os.environ, "PGPASSFILE": store.credentials, "MLFLOW_DISABLE_TELEMETRY": "true",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": str(POOL_SIZE), "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": str(MAX_OVERFLOW),
           "MLFLOW_AUTH_CONFIG_PATH": _auth_config(store), "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
           # Signs the login form's CSRF token: one key for all the server's workers.
           "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(32)}
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)  # a client's, not the server's
    started = time.monotonic()
    with open(os.path.join(store.folder, "mlflow.log"), "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store.database_uri("mlflow"),
             "--serve-artifacts", "--artifacts-destination", artifacts, "--host", store.host,
             "--port", str(store.mlflow_port), "--workers", str(SERVER_WORKERS), "--app-name", "basic-auth",
             "--uvicorn-opts", UVICORN_OPTS],
            cwd=store.folder, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    store = TeamStore(store.folder, store.host, store.pg_port, store.mlflow_port, process.pid)
    while not _answers(store.tracking_uri):
        if process.poll() is not None or time.monotonic() - started > START_TIMEOUT_S:
            _stop_group(process.pid)
            if stop_postgres_on_failure:
                stop_postgres(store.folder)
            raise RuntimeError(f"the MLflow server did not serve {store.tracking_uri} "
                               f"(see {os.path.join(store.folder, 'mlflow.log')})")
        time.sleep(0.5)
    _fast_admin_hash(store, admin_password)
    say(f"mlflow: serving {store.tracking_uri} ({time.monotonic() - started:.1f} s), artifacts in {artifacts}")
    return store


# How the admin's password is kept in auth.db. MLflow hashes it with werkzeug's default,
# scrypt (N=32768): tens to hundreds of ms of CPU per check, and the server checks the
# password on every request, so concurrent sweep drivers queue behind each other's logins
# until a store check times out. Key stretching protects a
# password a person chose; this one is 24 random bytes (192 bits), which no hash makes
# easier or harder to guess, so one round of PBKDF2-SHA256 keeps it as safe for a
# thousandth of the cost. Users added later through MLflow keep MLflow's own hash.
ADMIN_HASH_METHOD = "pbkdf2:sha256:1"


def _fast_admin_hash(store: TeamStore, password: str) -> None:
    import sqlite3

    from werkzeug.security import generate_password_hash

    with contextlib.closing(sqlite3.connect(os.path.join(store.folder, "auth.db"), timeout=30)) as database:
        with database:
            updated = database.execute("UPDATE users SET password_hash = ? WHERE username = ?",
                                       (generate_password_hash(password, ADMIN_HASH_METHOD), MLFLOW_USER)).rowcount
    if updated != 1:
        raise RuntimeError(f"no MLflow user {MLFLOW_USER!r} in {os.path.join(store.folder, 'auth.db')}: "
                           f"the server did not create its admin (see {os.path.join(store.folder, 'mlflow.log')})")


def _answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


def read(folder: str = DEFAULT_DIR) -> Optional[TeamStore]:
    """The team store running from ``folder``; None when none is."""
    try:
        with open(_state_path(folder)) as state_file:
            store = TeamStore(**json.load(state_file))
    except (OSError, ValueError, TypeError):
        return None
    return store if _running(store.mlflow_pid) or _postgres_running(folder) else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _postgres_running(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, "pgdata", "postmaster.pid"))


def _stop_group(pid: int, grace_s: float = 10.0) -> None:
    """The MLflow server and its workers (its own session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            # Started by this process (up, a restart): it stays in its group as a zombie
            # until reaped, and the wait would last the whole grace.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def stop_postgres(folder: str) -> None:
    data = os.path.join(folder, "pgdata")
    if _postgres_running(folder):
        subprocess.run(_as_server_user([_bin("pg_ctl"), "-D", data, "-m", "fast", "-w", "stop"]),
                       capture_output=True, timeout=90)


def restart_mlflow(store: TeamStore, down_s: float = 0.0, say=print) -> TeamStore:
    """Stop the MLflow server (SIGTERM, then SIGKILL) and start it again on the same port
    after ``down_s``: what an operator's restart or a rescheduled server does to the sweeps
    writing to it. Returns the store with the new server's pid."""
    if store.mlflow_pid:
        _stop_group(store.mlflow_pid)
    time.sleep(down_s)
    store = _start_mlflow(store, say, stop_postgres_on_failure=False)
    _save(store)
    return store


def restart_postgres(store: TeamStore, down_s: float = 0.0, say=print) -> None:
    """Stop PostgreSQL (fast: every client's connection is ended, as in a failover) and
    start it again after ``down_s``."""
    stop_postgres(store.folder)
    time.sleep(down_s)
    start_postgres(store, say)


def down(folder: str = DEFAULT_DIR) -> bool:
    """Stop the MLflow server and PostgreSQL; the data stays in the folder for the next up."""
    store = read(folder)
    if store is None:
        return False
    if store.mlflow_pid:
        _stop_group(store.mlflow_pid)
    stop_postgres(folder)
    os.remove(_state_path(folder))
    return True


def connections(store: TeamStore) -> int:
    """Client connections PostgreSQL holds now (pg_stat_activity, this server's clients)."""
    return sum(connections_by_database(store).values())


def connections_by_database(store: TeamStore) -> dict[str, int]:
    """Client connections PostgreSQL holds now, by database: ``mlflow`` (the MLflow
    server's) and ``optuna`` (the sweep drivers')."""
    counts: dict[str, int] = {}
    for database, _ in clients(store):
        counts[database] = counts.get(database, 0) + 1
    return counts


def clients(store: TeamStore) -> list[tuple[str, Optional[str]]]:
    """PostgreSQL's client connections now, less the one asking: (database, client address;
    None over the Unix socket), from pg_stat_activity."""
    import psycopg

    with psycopg.connect(host=store.host, port=store.pg_port, user=ROLE, dbname="mlflow",
                         passfile=store.credentials, connect_timeout=5) as connection:
        return [(database, address) for database, address in connection.execute(
            "SELECT datname, host(client_addr) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid()").fetchall()]


def how_to_use(store: TeamStore) -> str:
    return (f"sweeps use it with:\n  export PGPASSFILE={store.credentials}\n"
            f"  install -D -m 600 {store.mlflow_credentials} ~/.mlflow/credentials"
            f"   # or MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD\n"
            f"  accelsweep run neuron_vit --tracking-uri {store.tracking_uri} --study-storage {store.study_storage}\n"
            f"review: open {store.tracking_uri}; the studies: optuna-dashboard {store.study_storage}\n"
            f"stop it: accelsweep team-store down" + ("" if store.folder == DEFAULT_DIR else f" --dir {store.folder}"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accelsweep team-store",
        description="A team's shared record: PostgreSQL and an MLflow server on it (artifacts served), "
                    "and a database for the Optuna studies, all in one folder.")
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--dir", default=DEFAULT_DIR, help=f"where its data, logs and credentials live "
                                                           f"(default {DEFAULT_DIR})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address both servers bind (default 127.0.0.1; a cluster head's for its hosts)")
    parser.add_argument("--pg-port", type=int, default=5433, help="PostgreSQL's port (default 5433)")
    parser.add_argument("--mlflow-port", type=int, default=5000, help="the MLflow server's port (default 5000)")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            print(how_to_use(up(args.dir, args.host, args.pg_port, args.mlflow_port)))
        elif args.action == "down":
            print("stopped the team store (its data stays in " + args.dir + ")" if down(args.dir)
                  else f"no team store running from {args.dir}")
        else:
            store = read(args.dir)
            if store is None:
                print(f"no team store running from {args.dir}")
                return 1
            print(f"team store in {store.folder}: mlflow {store.tracking_uri} "
                  f"({'serving' if _answers(store.tracking_uri) else 'NOT answering'}); postgresql "
                  f"{store.host}:{store.pg_port}, {connections(store)} client connection(s) now\n" + how_to_use(store))
    except (ConfigError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or ""
        print(f"error: {error}" + (f"\n{detail.strip()}" if detail else ""), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
