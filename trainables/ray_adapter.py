"""Every use of Ray's private API, in one place.

Ray has no public way to do what these functions do. Its private names move between
releases without notice, so they are kept here, each behind a function that says what
we use it for, and tests/test_ray_adapter.py calls each one against the installed Ray:
an upgrade that renames or changes one fails there, by name, instead of deep inside a
sweep. Written against Ray 2.60. Imports are lazy: importing this module imports no Ray.

Used by the sweep driver (``accelsweep.sweeps.driver``) and by the Neuron training
backend (``accelsweep.trainables.platforms.neuron_backend``); a module of ``trainables``
so that the worker-side code need not import the driver.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Optional

from accelsweep.trainables.processes import command_line, process_table


def restored_callbacks(tuner) -> list:
    """The callbacks of a Tuner made by ``Tuner.restore``: the ones the sweep started
    with, unpickled from the experiment state. Ray keeps the original RunConfig on
    restore and has no public getter for it."""
    return list(tuner._local_tuner.get_run_config().callbacks or [])


def restored_scheduler(tuner):
    """The trial scheduler of a Tuner made by ``Tuner.restore``: the one the sweep started
    with, as it was built (Tune saves none of its state), the object fit() then uses."""
    return tuner._local_tuner._tune_config.scheduler


def resolve_auto_address() -> str:
    """What ``ray.init(address="auto")`` would connect to: $RAY_ADDRESS, else the
    cluster the last ``ray start`` on this machine recorded. Raises ConnectionError
    when there is none."""
    from ray._private.services import canonicalize_bootstrap_address_or_die

    return canonicalize_bootstrap_address_or_die("auto")


def loopback_address(address: str) -> Optional[str]:
    """The loopback address ``address`` names ("auto": $RAY_ADDRESS, else the cluster the
    last ``ray start`` here recorded), or None when it names none."""
    from ray._private.utils import read_ray_address

    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or read_ray_address() or ""
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    return address if host in ("127.0.0.1", "localhost") else None


def keep_loopback(address: str) -> None:
    """Connect to a cluster bound to loopback (``accelsweep cluster up``) at loopback.
    Ray rewrites 127.0.0.1 into this machine's interface address (resolve_ip_for_localhost),
    where such a cluster does not answer, unless its switch for machines that run no
    clusters is set: set it for a loopback ``address``, in this process (Ray read it at
    import) and for the processes it starts. Only for a driver about to connect: it holds
    for the rest of the process (a ``ray start`` this process ran after it would refuse
    to join a cluster)."""
    from ray._private import ray_constants

    if loopback_address(address):
        os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False


def local_cpus() -> int:
    """The CPUs a local Ray instance started here gets (container CPU limits included)."""
    from ray._private.utils import get_num_cpus

    return get_num_cpus()


def local_accelerators(resource: str) -> int:
    """How many of ``resource`` ("GPU", "neuron_cores", "TPU") a local Ray instance
    started here detects; 0 for a resource Ray has no accelerator manager for."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    manager = get_accelerator_manager_for_resource(resource)
    return manager.get_current_node_num_accelerators() if manager else 0


def free_address_and_port() -> tuple[str, int]:
    """This node's IP and a port free on it now (Ray Train's own rendezvous helper)."""
    from ray.train._internal.utils import get_address_and_port

    return get_address_and_port()


def neuron_xla_backend() -> Any:
    """Ray Train's Neuron XLA backend class (``_TorchAwsNeuronXLABackend``), to subclass.
    Imports torch: call it only where a Neuron trial runs."""
    from ray.train.torch.xla.config import _TorchAwsNeuronXLABackend

    return _TorchAwsNeuronXLABackend


def report_hook(transform) -> Any:
    """A context in which each ``tune.report`` of the trial running in this process passes
    its metrics through ``transform`` (a dict in, a dict out) first, whoever calls it and
    however it was imported: the trial's session object, which every report goes through,
    has no public hook. Outside a Tune trial (no session) it changes nothing."""
    import contextlib

    from ray.train._internal.session import get_session

    @contextlib.contextmanager
    def hooked():
        session = get_session()
        if session is None:
            yield
            return
        report = session.report

        def transformed(metrics, *args, **kwargs):
            return report(transform(metrics), *args, **kwargs)

        session.report = transformed  # an attribute of this instance: its class is left alone
        try:
            yield
        finally:
            del session.report

    return hooked()


def trial_actor(trial) -> Any:
    """The actor a running Tune trial runs in (None when it has none): Tune keeps it in the
    trial's temporary state, with no public getter."""
    return trial.temporary_state.ray_actor


def actor_process(actor) -> Any:
    """(node id, pid) of the process an actor lives in, read from Ray's actor table in the
    GCS (no dashboard needed, and the actor need not answer: it may be wedged); None when
    the table has no live process for it."""
    from ray._private import state

    info = state.actors(actor._actor_id.hex())
    pid, node_id = info.get("Pid"), (info.get("Address") or {}).get("NodeID")
    return (node_id, int(pid)) if pid and node_id else None


def tune_interrupt_handler() -> Any:
    """The handler a running ``tune.run`` (``Tuner.fit``) ends its loop with, as Ctrl-C
    does there (it saves the experiment, stops the trials and returns), when one is
    running on this thread now; else None. Tune keeps it on SIGUSR1 whatever
    TUNE_DISABLE_SIGINT_HANDLER says, and offers no public way to stop a run."""
    import signal

    handler = signal.getsignal(signal.SIGUSR1)
    if getattr(handler, "__module__", "") == "ray.tune.tune" and \
            getattr(handler, "__name__", "") == "signal_interrupt_tune_run":
        return handler
    return None


def sigterm_handler_kept():
    """A context in which ``ray.init`` leaves the process's SIGTERM handler alone. It
    sets one to exit at once, and a local head node one that kills the instance's
    processes first (the driver's core worker then aborts: SIGABRT, a C++ stack); a
    sweep handles SIGTERM itself (accelsweep.sweeps.driver.run.stop_signals)."""
    import contextlib

    import ray._private.utils as ray_utils

    @contextlib.contextmanager
    def kept():
        original = ray_utils.set_sigterm_handler
        ray_utils.set_sigterm_handler = lambda handler: None
        try:
            yield
        finally:
            ray_utils.set_sigterm_handler = original

    return kept()


def local_instance_confined(agent_shim: str) -> Any:
    """A context in which ``ray.init`` starts a local instance that (1) listens on
    127.0.0.1 only, and (2) whose agents die with its raylet.

    (1) Every Ray 2.60 listener (GCS, raylet, core workers, the agents, metrics) binds
    loopback when the node's IP is a localhost address, all interfaces otherwise; there is
    no bind-address setting. On Linux ``services.get_node_ip_address`` turns 127.0.0.1
    back into the machine's address unless ``ray_constants.ENABLE_RAY_CLUSTER`` is False
    (Ray's own default on macOS and Windows), which it reads when called.
    (2) The raylet starts the DashboardAgent and RuntimeEnvAgent without a parent-death
    signal; ``agent_shim`` (sweeps/driver/run/raylet_child.py) is put in front of their
    command, as Ray itself puts memray there: it sets one, then execs the agent."""
    import contextlib
    import sys

    import ray._private.ray_constants as ray_constants
    import ray._private.services as services

    agents = (ray_constants.PROCESS_TYPE_DASHBOARD_AGENT, ray_constants.PROCESS_TYPE_RUNTIME_ENV_AGENT)

    @contextlib.contextmanager
    def confined():
        cluster, build = ray_constants.ENABLE_RAY_CLUSTER, services._build_python_executable_command_memory_profileable

        def build_with_shim(component, session_dir, unbuffered=True):
            command = build(component, session_dir, unbuffered)
            return [sys.executable, "-S", agent_shim, *command] if component in agents else command

        ray_constants.ENABLE_RAY_CLUSTER = False
        services._build_python_executable_command_memory_profileable = build_with_shim
        try:
            yield
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = cluster
            services._build_python_executable_command_memory_profileable = build

    return confined()


def without_idle_processes(log_monitor: bool) -> Any:
    """A context in which ``ray.init`` starts a local instance without the processes a
    private single-node instance leaves idle: the autoscaler's monitor (there is no node to
    add or remove) and, unless ``log_monitor``, the log monitor (it only copies the
    workers' output to a driver that asked for it). ray.init has no setting for either;
    ``ray start`` has (--no-monitor, --include-log-monitor), and both land in RayParams,
    which is where this sets them."""
    import contextlib

    from ray._private import parameter

    @contextlib.contextmanager
    def lean():
        original = parameter.RayParams.__init__

        def init(self, *args, **kwargs):
            kwargs.setdefault("no_monitor", True)
            kwargs.setdefault("include_log_monitor", log_monitor)
            original(self, *args, **kwargs)

        parameter.RayParams.__init__ = init
        try:
            yield
        finally:
            parameter.RayParams.__init__ = original

    return lean()


def entrypoint_shown_as(redact) -> Any:
    """A context in which ``ray.init`` records the driver's command line as ``redact``
    (a function of argv -> argv) makes it: Ray keeps it as the job's entrypoint in the GCS
    job table (``ray list jobs``, the dashboard), which anyone who reaches the cluster
    reads. Ray 2.60's ray.init reads it from ``ray._private.utils.get_entrypoint_name``
    (psutil's cmdline of this process) at the moment it connects."""
    import contextlib
    import subprocess
    import sys

    import ray._private.utils as ray_utils

    @contextlib.contextmanager
    def shown():
        original = ray_utils.get_entrypoint_name
        prefix = "(interactive_shell) " if hasattr(sys, "ps1") else ""

        def redacted() -> str:
            try:
                import psutil

                return prefix + subprocess.list2cmdline(redact(psutil.Process().cmdline()))
            except Exception:  # as Ray's own: an entrypoint is not worth a failed start
                return "unknown"

        ray_utils.get_entrypoint_name = redacted
        try:
            yield
        finally:
            ray_utils.get_entrypoint_name = original

    return shown()


# Tune's saved experiment (a stopped sweep's, for --resume: sweeps/driver/record/resumed_runs.py).
# Tune writes it every TUNE_GLOBAL_CHECKPOINT_S into the experiment directory: the newest
# experiment_state-<session>.json (each trial's JSON state, with its status) and
# search_gen_state-<session>.json (a cloudpickle, despite its name: the search generator's
# and its wrappers' state, a ConcurrencyLimiter's live trials among them).
IN_FLIGHT_STATUSES = ("PENDING", "RUNNING", "PAUSED")
# The files of one save of session <s> (TuneController, SearchGenerator, the searcher's
# own save, CallbackList), and where a save that cannot be used is moved.
SAVE_FILES = ("experiment_state-{}.json", "search_gen_state-{}.json", "searcher-state-{}.pkl",
              "callback-states-{}.pkl")
SET_ASIDE = "set-aside"


def saved_trial_statuses(experiment_dir: str) -> Any:
    """Tune trial id -> its status (PENDING, RUNNING, PAUSED, TERMINATED, ERROR) in the
    newest whole save Tune made in ``experiment_dir``; None where it made none (a driver
    killed before Tune's first save).

    Tune writes each save into a staging folder and copies it file by file, in place, into
    the experiment directory: a driver killed during that copy leaves files cut short, or
    the files of one save beside those of the one before (all in place). A save whose files
    do not all read, or disagree on the trials (the search generator's count of them, the
    searcher's own trials), is set aside (moved to ``SET_ASIDE``), and the one before it is
    taken: what happened since is in MLflow (sweeps/driver/record/resumed_runs.py)."""
    import json
    import os
    import pickle

    import ray.cloudpickle as cloudpickle

    def read(session: str) -> Any:
        path = os.path.join(experiment_dir, SAVE_FILES[0].format(session))
        try:
            with open(path) as saved:
                trials = [json.loads(trial_json) for trial_json, _ in json.load(saved)["trial_data"]]
            with open(os.path.join(experiment_dir, SAVE_FILES[1].format(session)), "rb") as saved:
                created = cloudpickle.load(saved)["counter"]
            with open(os.path.join(experiment_dir, SAVE_FILES[2].format(session)), "rb") as saved:
                proposed = pickle.load(saved)["_ot_trials"]  # OptunaSearch.save: its __dict__
            callbacks = os.path.join(experiment_dir, SAVE_FILES[3].format(session))
            if os.path.exists(callbacks):  # none where no callback has state
                with open(callbacks, "rb") as saved:
                    cloudpickle.load(saved)
        except (OSError, EOFError, ValueError, KeyError, TypeError, pickle.UnpicklingError):
            return None
        statuses = {trial["trial_id"]: trial["status"] for trial in trials}
        return statuses if created == len(statuses) and set(proposed) == set(statuses) else None

    for session in sorted(_saved_sessions(experiment_dir), reverse=True):
        statuses = read(session)
        if statuses is not None:
            return statuses
        os.makedirs(os.path.join(experiment_dir, SET_ASIDE), exist_ok=True)
        for name in SAVE_FILES:
            path = os.path.join(experiment_dir, name.format(session))
            if os.path.exists(path):
                os.replace(path, os.path.join(experiment_dir, SET_ASIDE, name.format(session)))
    return None


def repair_saved_state(experiment_dir: str, ended_trial_ids) -> None:
    """Make Tune's saved state agree with what happened after it was saved: the trials
    ``ended_trial_ids`` (in flight when it was saved) have ended, so that ``Tuner.restore``
    does not run them again; a concurrency limit counts only the trials still in flight
    (else one it counts forever would hold its slot); the search generator's count of
    trials created is the number of trials (else fewer or more than num_samples run). Each
    file is replaced whole; a driver killed between the two leaves what the next call
    repairs."""
    import glob
    import json
    import os

    import ray.cloudpickle as cloudpickle

    ended = set(ended_trial_ids)
    path = _newest_experiment_state(experiment_dir)
    with open(path) as saved:
        state = json.load(saved)
    in_flight = set()
    for entry in state["trial_data"]:
        trial = json.loads(entry[0])
        if trial["status"] in IN_FLIGHT_STATUSES and trial["trial_id"] in ended:
            trial["status"] = "TERMINATED"
            entry[0] = json.dumps(trial, indent=2)
        elif trial["status"] in IN_FLIGHT_STATUSES:
            in_flight.add(trial["trial_id"])
    if ended:
        _replace(path, json.dumps(state).encode())
    # Tune picks the newest search state by name (ray.tune.utils.util._load_newest_checkpoint).
    search_states = glob.glob(os.path.join(experiment_dir, "search_gen_state-*.json"))
    if not search_states:
        return
    search_path = max(search_states)
    with open(search_path, "rb") as saved:
        search_state = cloudpickle.load(saved)
    search_state["counter"] = len(state["trial_data"])
    for name, wrapper in search_state.items():
        if name.startswith("name:") and isinstance(wrapper, dict) and "live_trials" in wrapper:
            wrapper["live_trials"] = set(wrapper["live_trials"]) & in_flight
            wrapper["num_unfinished_live_trials"] = len(wrapper["live_trials"])
    _replace(search_path, cloudpickle.dumps(search_state))


def start_afresh(tuner) -> None:
    """Let a Tuner made by ``Tuner.restore`` run as a new experiment: one whose driver was
    killed before Tune first saved it has nothing to resume (its fit would fail), and the
    searcher and callbacks it holds are as they were at its start."""
    tuner._local_tuner._is_restored = False


def _saved_sessions(experiment_dir: str) -> set:
    """The sessions any file of a save names (a copy cut short may have brought some)."""
    import glob
    import os

    sessions = set()
    for name in SAVE_FILES:
        prefix, suffix = name.split("{}")
        for path in glob.glob(os.path.join(experiment_dir, name.format("*"))):
            sessions.add(os.path.basename(path)[len(prefix):-len(suffix)])
    return sessions


def _newest_experiment_state(experiment_dir: str) -> Any:
    from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint

    return _find_newest_experiment_checkpoint(experiment_dir)


def _replace(path: str, content: bytes) -> None:
    import os

    with open(path + ".tmp", "wb") as new:
        new.write(content)
    os.replace(path + ".tmp", path)


def on_this_node() -> dict[str, Any]:
    """Actor options that keep an actor on the node of the process creating it. A sweep's
    own actors (its rejection board, its trials' progress) belong beside its driver: with
    no CPU to ask for they could land on any node, and on an autoscaling cluster a worker
    node goes when its trials end (the actor with it, mid-sweep)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                  soft=False)}


# A resource only the head node has: an actor that must outlive every worker node asks a
# sliver of it (worker nodes of an autoscaling cluster come and go).
HEAD_NODE_RESOURCE = {"node:__internal_head__": 0.001}


def session_names_dir() -> str:
    """A folder in this host's Ray session (where Tune stages each driver's files, under
    its experiment's name) in which drivers on this host claim their experiments' names."""
    import ray._private.worker

    return os.path.join(ray._private.worker._global_node.get_session_dir_path(), "accelsweep-experiments")


def autoscaler_node_groups() -> Optional[list[tuple[str, dict[str, float], int]]]:
    """The worker node types an autoscaler v2 reported to the GCS: (name, resources, the
    most nodes of it), as Ray Train and Ray Data read them. None where none was reported
    (autoscaler v1, which ``ray up`` starts, does not), or this Ray cannot say."""
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
    except Exception:  # noqa: BLE001 - a Ray without it, or a GCS that did not answer: nothing known
        return None
    if config is None or not config.node_group_configs:
        return None
    return [(group.name, {k: float(v) for k, v in group.resources.items()}, int(group.max_count))
            for group in config.node_group_configs if group.max_count != 0]


AUTOSCALER_V1 = "autoscaler/_private/monitor.py"
CONFIG_FLAG = "--autoscaling-config"  # the monitor is started with it as --autoscaling-config=PATH


def autoscaler_config_path(gcs_address: str) -> Optional[str]:
    """The config file of the autoscaler v1 of the cluster at ``gcs_address`` where it runs
    on this host (its head: ``ray up``'s ``~/ray_bootstrap_config.yaml``, a local
    cluster's own), from its command line. Its GCS port tells it from another cluster's."""
    port = gcs_address.rsplit(":", 1)[-1]
    for pid in process_table(include_zombies=False):
        arguments = command_line(pid) or []
        if not any(argument.endswith(AUTOSCALER_V1) for argument in arguments):
            continue
        flags = dict(argument.split("=", 1) for argument in arguments if argument.startswith("--") and "=" in argument)
        if flags.get("--gcs-address", "").rsplit(":", 1)[-1] == port and CONFIG_FLAG in flags:
            return os.path.expanduser(flags[CONFIG_FLAG])
    return None


def gcs_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


def nodes_up() -> list[dict[str, float]]:
    """Each live node's resources (the head's marked ``node:__internal_head__``)."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]


def live_job_ids() -> set:
    """The hex ids of the cluster's jobs (drivers) still alive, from the GCS job table."""
    import ray._private.state

    return {job["JobID"] for job in ray._private.state.jobs() if not job.get("IsDead")}


@contextlib.contextmanager
def tune_sharing_a_cluster(reuse_allowed):
    """Tune's loop, for a sweep that takes turns at a cluster's slots (fair_share.py):

    - while ``reuse_allowed()`` is False, no ended trial's actor is kept for the sweep's
      next trial, and one kept is given back: the actor holds the trial's resources, a
      slot another sweep cannot have (TuneController._maybe_cache_trial_actor, and
      on_step_end for one already kept);
    - the loop never blocks waiting for the searcher's next trial. With no trial pending
      or running Tune polls the searcher for up to 600 s without stepping its actors, so
      an ended trial's actor, stopping, is never ended and keeps its slot: seen holding 2
      CPUs for 100 s while the sweep waited for its turn (``_update_trial_queue``);
    - no trial yet (the first waits for a seat) is not Tune's "insufficient resources"
      case, which then fails on an empty list (``on_no_available_trials``)."""
    from ray.tune.execution.insufficient_resources_manager import _InsufficientResourcesManager
    from ray.tune.execution.tune_controller import TuneController

    keep, step_end = TuneController._maybe_cache_trial_actor, TuneController.on_step_end
    update_queue = TuneController._update_trial_queue

    def maybe_cache(self, trial):
        return keep(self, trial) if reuse_allowed() else False

    def on_step_end(self):
        step_end(self)
        if self._actor_cache.num_cached_objects and not reuse_allowed():
            self._cleanup_cached_actors(force_all=True)

    def never_blocking(self, blocking: bool = False, timeout: int = 600):
        added = update_queue(self, blocking=False, timeout=timeout)
        if blocking and not added:
            time.sleep(0.5)  # a pause between asks, as Tune's own wait has; then its actors are stepped
        return added

    no_trials = _InsufficientResourcesManager.on_no_available_trials

    def no_trials_yet_is_waiting(self, all_trials):
        return no_trials(self, all_trials) if all_trials else None

    saved = (keep, step_end, update_queue)
    TuneController._maybe_cache_trial_actor, TuneController.on_step_end = maybe_cache, on_step_end
    TuneController._update_trial_queue = never_blocking
    _InsufficientResourcesManager.on_no_available_trials = no_trials_yet_is_waiting
    try:
        yield
    finally:
        TuneController._maybe_cache_trial_actor, TuneController.on_step_end, TuneController._update_trial_queue = saved
        _InsufficientResourcesManager.on_no_available_trials = no_trials
