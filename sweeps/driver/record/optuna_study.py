"""The sweep as an Optuna study in a database, for Optuna's own tools.

The searcher's study lives inside Tune's pickled state, where neither ``optuna-dashboard``
nor ``optuna.load_study`` can reach it. So the driver writes each trial, as it ends, into a
study of its own (sqlite beside the MLflow store by default; any SQLAlchemy URL), named
after the sweep's MLflow parent run, with its params, its objective values and a state:

    finished                          COMPLETE  (values: the objectives)
    stopped early, rejected, cut      PRUNED    (the first objective as last reported; per window: intermediate)
    failed                            FAIL      (user attr "error")

Reused proposals ran nothing and stay in MLflow only; an interrupted trial is recorded when
it runs again on ``--resume``, which keeps using the same study. User attrs link each trial
to MLflow (``mlflow_run_id``, ``trial_number``, ``status``).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any, Iterator, Mapping, Optional, Sequence

import optuna

from accelsweep.sweeps.driver.record.database_errors import DRIVER_TIMEOUT_ARGS
from accelsweep.sweeps.driver.record.trial_record import (CUT_BY_BUDGET, FAILED, FINISHED, REJECTED, STOPPED_EARLY,
                                                          TrialRecord)
from accelsweep.trainables.errors import ConfigError
from accelsweep.sweeps.driver.record.secrets import redact_uri
from accelsweep.sweeps.driver.record.sqlite_store import create_optuna_storage

__all__ = ["SweepStudy", "default_study_storage", "holds", "quiet_optuna", "validate_study_storage"]

PRUNED_STATUSES = (STOPPED_EARLY, REJECTED, CUT_BY_BUDGET)


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs each study it creates (one per sampling here, one per sweep) at INFO:
    warnings only while inside, the caller's verbosity again after."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def default_study_storage(tracking_uri: str, storage_path: str) -> str:
    """Beside a sqlite MLflow store (mlflow.db: mlflow.optuna.db); else under the sweep's
    storage path (a server's store has no folder of ours)."""
    if tracking_uri.startswith("sqlite:///"):
        stem, _ = os.path.splitext(os.path.abspath(tracking_uri[len("sqlite:///"):]))
        return f"sqlite:///{stem}.optuna.db"
    return "sqlite:///" + os.path.join(os.path.abspath(os.path.expanduser(storage_path)), "optuna.db")


def validate_study_storage(url: str) -> str:
    """An SQLAlchemy database URL Optuna can keep a study in; a sqlite file's directory
    must exist (created for the default under the storage path)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    allowed = "an SQLAlchemy database URL (sqlite:///optuna.db, postgresql://host/db, mysql://...)"
    if not isinstance(url, str) or not url:
        raise ConfigError("study_storage", allowed, url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigError("study_storage", allowed, redact_uri(url)) from None
    if parsed.get_backend_name() == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise ConfigError("study_storage", "sqlite:///<path> (a file: the study must outlive the sweep)",
                              redact_uri(url))
        directory = os.path.dirname(os.path.abspath(parsed.database))
        if not os.path.isdir(directory):
            raise ConfigError("study_storage", "a sqlite file in an existing directory", redact_uri(url),
                              f"Directory {directory!r} does not exist.")
    return url


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class SweepStudy:
    """Writes a sweep's trials into its Optuna study. Pickled with Tune's experiment state
    (the sweep callback holds it): the database connection is opened where it is used."""

    def __init__(self, url: str, name: str, objectives: Sequence[tuple[str, str]],
                 distributions: Mapping[str, Any]):
        self.url, self.name = url, name
        self.objectives = list(objectives)
        self.distributions = dict(distributions)
        self._study = None
        self._recorded: Optional[set[str]] = None  # MLflow run ids the study holds, read once

    def __getstate__(self):
        # A database URL's password stays in this process: --resume sets the URL from its
        # flags again (lifecycle._resume).
        return {**self.__dict__, "_study": None, "_recorded": None, "url": redact_uri(self.url)}

    @property
    def study(self):
        if self._study is None:
            self._study = open_study(self.url, self.name, [mode for _, mode in self.objectives])
        return self._study

    def claim(self) -> str:
        """Create the sweep's study now, under a name no other study in the database has:
        its own, else with -2, -3, ... after it (two sweeps of one name started in the same
        second into one database would otherwise share a study). Returns the name."""
        base, modes = self.name, [mode for _, mode in self.objectives]
        for suffix in range(1, 1000):
            name = base if suffix == 1 else f"{base}-{suffix}"
            try:
                self._study = open_study(self.url, name, modes, load_if_exists=False)
            except optuna.exceptions.DuplicatedStudyError:
                continue
            self.name, self._recorded = name, set()
            return name
        raise RuntimeError(f"{self.describe()}: 999 studies named {base}-* already")

    def describe(self) -> str:
        return f"Optuna study {self.name!r} in {redact_uri(self.url)}"

    def record(self, record: TrialRecord, intermediate: Mapping[int, float] = ()) -> bool:
        """Add one ended trial; False for what is not an Optuna trial (a reuse, an
        interrupted trial) or a trial the study has already (a resumed sweep)."""
        from optuna.trial import TrialState, create_trial

        if record.status not in (FINISHED, FAILED, *PRUNED_STATUSES) or record.run_id is None:
            return False
        if self._recorded is None:  # once per driver: a resumed sweep's study has trials already
            self._recorded = {t.user_attrs.get("mlflow_run_id") for t in self.study.get_trials(deepcopy=False)}
        if record.run_id in self._recorded:
            return False
        values = [record.result.get(metric) for metric, _ in self.objectives]
        attrs = {"mlflow_run_id": record.run_id, "trial_number": record.number, "status": record.status,
                 "tune_trial_id": record.trial_id, "baseline": record.is_baseline}
        state, value_args = TrialState.COMPLETE, {"values": values}
        if record.status == FAILED or record.error:
            state, value_args = TrialState.FAIL, {}
            attrs["error"] = f"{record.error_class}: {record.error}"[:1000]
        elif not all(_finite(v) for v in values):
            state, value_args = TrialState.FAIL, {}  # Optuna cannot rank a trial without its values
            attrs["error"] = "an objective was not measured: " + ", ".join(
                metric for (metric, _), v in zip(self.objectives, values) if not _finite(v))
        elif record.status in PRUNED_STATUSES:
            state = TrialState.PRUNED
            value_args = {"value": values[0]} if len(values) == 1 else {}
        params = {k: v for k, v in record.searched.items() if k in self.distributions}
        if not all(holds(self.distributions[k], v) for k, v in params.items()):
            return False  # a step past the space's edge (define/edges.py): MLflow holds it, a study cannot
        trial = create_trial(state=state, params=params,
                             distributions={k: self.distributions[k] for k in params}, user_attrs=attrs,
                             intermediate_values={int(k): float(v) for k, v in dict(intermediate).items()
                                                  if _finite(v)} or None,
                             **value_args)
        try:
            self.study.add_trial(trial)
        except ValueError as error:  # e.g. a value outside its distribution: said, not fatal
            print(f"warning: trial {record.number} not added to {self.describe()}: {error}", flush=True)
            return False
        self._recorded.add(record.run_id)
        return True


def holds(distribution, value: Any) -> bool:
    """Whether ``value`` is a point of ``distribution`` (a choice of a categorical, within
    an int or float range): a sweep's points and a warm start's configs are checked so."""
    try:
        return distribution._contains(distribution.to_internal_repr(value))
    except ValueError:  # a categorical's value not among its choices
        return False


DRIVER_CONNECTIONS = 2  # a sweep driver's connections to a shared study database, at most


def open_study(url: str, name: str, modes: Sequence[str], load_if_exists: bool = True):
    """The study ``name`` in ``url``, created on first use (directions from ``modes``). A
    sqlite database is created whole first, safe against other processes creating it at
    the same moment (sweeps/driver/record/sqlite_store.py)."""
    create_optuna_storage(url)
    directions = ["maximize" if mode == "max" else "minimize" for mode in modes]
    with quiet_optuna():
        return optuna.create_study(storage=shared_storage(url), study_name=name, directions=directions,
                                   load_if_exists=load_if_exists)


_storages: dict[str, Any] = {}


def shared_storage(url: str):
    """The Optuna storage for ``url``, one per process. On a database server that many
    sweeps share, a driver then holds at most DRIVER_CONNECTIONS of its connections
    (SQLAlchemy's default pool would allow 15 per storage, and the study, the report and
    a resumed study would each open one), whatever the number of its trials; a busy pool
    makes a write wait. A sqlite file is the URL itself (Optuna's own handling)."""
    if url.startswith("sqlite"):
        return url
    if url not in _storages:
        from sqlalchemy.engine import make_url

        # pool_pre_ping: a connection the database ended (it restarted, failed over) is
        # replaced when next taken from the pool, instead of failing the write that takes it.
        # A connect timeout: a database host that swallows packets costs a write 10 s, not
        # the driver's whole loop.
        timeout_arg = DRIVER_TIMEOUT_ARGS.get(make_url(url).get_backend_name())
        engine_kwargs = {"pool_size": DRIVER_CONNECTIONS, "max_overflow": 0, "pool_pre_ping": True,
                         **({"connect_args": {timeout_arg: CONNECT_TIMEOUT_S}} if timeout_arg else {})}
        _create_tables(url, engine_kwargs.get("connect_args", {}))
        _storages[url] = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    return _storages[url]


SCHEMA_RACE_TRIES = 5


def _create_tables(url: str, connect_args: dict) -> None:
    """Optuna creates its tables in a new database with CREATE TABLE (SQLAlchemy's
    create_all: look, then create). Sweeps started together on a new PostgreSQL database
    all look, find none, and all but one fail ("duplicate key value violates unique
    constraint pg_type_typname_nsp_index", "relation ... already exists"): whoever lost
    tries again, and finds the tables. Done on connections that close after each use
    (NullPool), so a lost try leaves none open beside the driver's pool."""
    from sqlalchemy import exc
    from sqlalchemy.pool import NullPool

    for attempt in range(1, SCHEMA_RACE_TRIES + 1):
        try:
            optuna.storages.RDBStorage(url, engine_kwargs={"poolclass": NullPool, "connect_args": connect_args})
            return
        except (exc.IntegrityError, exc.ProgrammingError) as error:
            if attempt == SCHEMA_RACE_TRIES or not any(
                    word in str(error) for word in ("already exists", "pg_type_typname_nsp_index", "duplicate key")):
                raise
            time.sleep(0.2 * attempt)


CONNECT_TIMEOUT_S = 10


