"""Each private Ray name we use (trainables/ray_adapter.py) still exists and behaves as
used. A Ray upgrade that moves or changes one fails here, by name, not mid-sweep."""

from __future__ import annotations

import os

import pytest

from accelsweep.trainables import ray_adapter


class Marker:
    """Stands for SweepCallback: state that must come back from Tune's saved experiment."""

    def __init__(self, label: str):
        self.label = label


def no_trial(config):
    raise AssertionError("the experiment is saved and restored, never run")


def test_a_restored_tuner_gives_back_the_callbacks_it_was_started_with(tmp_path):
    from ray import tune

    class MarkerCallback(tune.Callback, Marker):
        pass

    tune.Tuner(no_trial, run_config=tune.RunConfig(name="saved", storage_path=str(tmp_path),
                                                   callbacks=[MarkerCallback("the sweep's")]))
    restored = tune.Tuner.restore(str(tmp_path / "saved"), no_trial)
    callbacks = ray_adapter.restored_callbacks(restored)
    assert [type(c).__name__ for c in callbacks] == ["MarkerCallback"]
    assert callbacks[0].label == "the sweep's"


def test_auto_address_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "203.0.113.7:6390")  # not this host: kept as given
    assert ray_adapter.resolve_auto_address() == "203.0.113.7:6390"


def test_auto_address_without_a_cluster_is_a_connection_error(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where `ray start` records its cluster: empty here
    try:
        address = ray_adapter.resolve_auto_address()
    except ConnectionError:
        return  # check_ray_address turns this into its refusal
    assert isinstance(address, str) and ":" in address  # a cluster this machine started is running


def test_local_resources_are_counted_as_ray_init_would():
    cpus = ray_adapter.local_cpus()
    assert isinstance(cpus, int) and 1 <= cpus <= (os.cpu_count() or cpus)
    for resource in ("GPU", "neuron_cores", "TPU"):
        count = ray_adapter.local_accelerators(resource)
        assert isinstance(count, int) and count >= 0, resource
    assert ray_adapter.local_accelerators("no_such_accelerator") == 0


def test_a_free_port_on_this_node():
    address, port = ray_adapter.free_address_and_port()
    assert isinstance(address, str) and address and isinstance(port, int) and 0 < port < 65536


def test_the_neuron_backend_base_class_is_a_ray_train_backend():
    pytest.importorskip("torch")
    from ray.train.backend import Backend

    base = ray_adapter.neuron_xla_backend()
    assert issubclass(base, Backend) and callable(base.on_start)


@pytest.mark.slow
def test_an_actors_process_is_read_from_the_actor_table(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    class Where:
        def pid(self):
            return os.getpid()

    actor = Where.remote()
    try:
        pid = ray.get(actor.pid.remote(), timeout=120)
        assert ray_adapter.actor_process(actor) == (ray.get_runtime_context().get_node_id(), pid)
    finally:
        ray.kill(actor)


def test_a_tune_trial_keeps_its_actor_where_the_adapter_reads_it():
    from ray.tune.experiment import Trial

    # Not started: none yet (Tune's set_ray_actor fills it; tests/test_trial_timeout.py's
    # hung trial is found through it).
    assert ray_adapter.trial_actor(Trial("no_trainable", stub=True)) is None


def test_tunes_stop_handler_is_found_while_a_tune_run_would_have_it_set():
    import signal

    from ray.tune import tune as tune_run_module

    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGUSR1)}
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        assert ray_adapter.tune_interrupt_handler() is None
        stopped = tune_run_module._setup_signal_catching()  # what tune.run does before its loop
        handler = ray_adapter.tune_interrupt_handler()
        assert handler is not None
        handler(signal.SIGUSR1, None)
        assert stopped.is_set()  # the event tune.run's loop ends on
    finally:
        for signum, previous in saved.items():
            signal.signal(signum, previous)


def test_ray_init_leaves_sigterm_alone_in_the_adapters_context():
    import signal

    import ray._private.utils as ray_utils

    setter, handler = ray_utils.set_sigterm_handler, signal.getsignal(signal.SIGTERM)
    with ray_adapter.sigterm_handler_kept():
        ray_utils.set_sigterm_handler(lambda signum, frame: None)  # what ray.init and a head node call
        assert signal.getsignal(signal.SIGTERM) is handler
    assert ray_utils.set_sigterm_handler is setter


def one_report(config):
    from ray import tune

    tune.report({"y": float(config["x"])})


def x_space(trial):
    trial.suggest_int("x", 0, 9)


@pytest.mark.slow
def test_tunes_saved_experiment_is_read_repaired_and_set_aside_where_a_save_is_cut_short(ray_session, tmp_path):
    import glob
    import json

    from ray import tune

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    searcher = FailureAwareOptunaSearch(x_space, metric="y", mode="max", sweep_token="adapter", budget=2)
    tune.Tuner(one_report, tune_config=tune.TuneConfig(search_alg=searcher, num_samples=2, max_concurrent_trials=1),
               run_config=tune.RunConfig(name="saved", storage_path=str(tmp_path), verbose=0)).fit()
    experiment = str(tmp_path / "saved")
    statuses = ray_adapter.saved_trial_statuses(experiment)
    assert list(statuses.values()) == ["TERMINATED", "TERMINATED"]

    # One trial saved in flight (and counted by the concurrency limit), then said ended.
    [state_path] = glob.glob(f"{experiment}/experiment_state-*.json")
    state = json.load(open(state_path))
    trial = json.loads(state["trial_data"][0][0])
    trial["status"] = "RUNNING"
    state["trial_data"][0][0] = json.dumps(trial)
    json.dump(state, open(state_path, "w"))
    assert ray_adapter.saved_trial_statuses(experiment)[trial["trial_id"]] == "RUNNING"
    ray_adapter.repair_saved_state(experiment, {trial["trial_id"]})
    assert ray_adapter.saved_trial_statuses(experiment)[trial["trial_id"]] == "TERMINATED"

    # The searcher's file cut short by a kill during Tune's copy: that save is set aside.
    [searcher_path] = glob.glob(f"{experiment}/searcher-state-*.pkl")
    open(searcher_path, "wb").close()
    assert ray_adapter.saved_trial_statuses(experiment) is None
    assert not glob.glob(f"{experiment}/*-state-*") and len(glob.glob(f"{experiment}/set-aside/*")) == 3

    # A Tuner restored from a directory with no save runs as a new experiment.
    restored = tune.Tuner.restore(experiment, one_report)
    ray_adapter.start_afresh(restored)
    assert restored._local_tuner._is_restored is False


def two_windows(config):
    from ray import tune

    for step in (1, 2):
        tune.report({"score": float(config["x"] + step)})


@pytest.mark.slow
def test_a_restored_tuner_runs_the_scheduler_it_gives_back_after_its_callbacks_state(ray_session, tmp_path):
    """What --resume's replay of the windows rests on (lifecycle._resume): the scheduler
    ``restored_scheduler`` returns is the one fit() uses, and Tune hands its callbacks
    their saved state before it adds the saved trials back to that scheduler."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from accelsweep.sweeps.driver.run.schedulers import TrustedWindowsOnly

    class WindowKeeper(tune.Callback):
        def __init__(self):
            self.windows, self.scheduler = {}, None

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.windows.setdefault(trial.trial_id, {})[result["training_iteration"]] = {
                "training_iteration": result["training_iteration"], "score": result["score"]}

        def get_state(self):
            return {"windows": self.windows}

        def set_state(self, state):
            self.windows = state["windows"]
            if self.scheduler is not None:
                self.scheduler.replay(self.windows)

    def rung(scheduler, milestone):
        return dict(scheduler.scheduler._brackets[0]._rungs)[milestone]

    asha = ASHAScheduler(time_attr="training_iteration", metric="score", mode="max", max_t=2, grace_period=1)
    tune.Tuner(two_windows, param_space={"x": tune.grid_search([1, 2])},
               tune_config=tune.TuneConfig(scheduler=TrustedWindowsOnly(asha, ("score", "max"))),
               run_config=tune.RunConfig(name="saved", storage_path=str(tmp_path), verbose=0,
                                         callbacks=[WindowKeeper()])).fit()
    restored = tune.Tuner.restore(str(tmp_path / "saved"), two_windows)
    scheduler = ray_adapter.restored_scheduler(restored)
    [keeper] = ray_adapter.restored_callbacks(restored)
    assert isinstance(scheduler, TrustedWindowsOnly) and rung(scheduler, 1) == {} and keeper.windows == {}
    keeper.scheduler = scheduler
    restored.fit()  # both trials ended: nothing runs again
    assert len(keeper.windows) == 2 and scheduler.best == 4.0
    assert sorted(rung(scheduler, 1).values()) == [2.0, 3.0]


def test_keep_loopback_stops_ray_rewriting_a_loopback_address(monkeypatch):
    import ray
    from ray._private import ray_constants, services

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "1")  # put back after the test
    assert ray_adapter.loopback_address("10.0.0.5:6379") is None
    ray_adapter.keep_loopback("10.0.0.5:6379")  # not loopback: nothing changes
    assert ray_constants.ENABLE_RAY_CLUSTER is True
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    ray_adapter.keep_loopback("auto")  # the address $RAY_ADDRESS names
    assert ray_constants.ENABLE_RAY_CLUSTER is False  # what resolve_ip_for_localhost reads
    if ray._private.worker._global_node is None:  # else Ray answers with the running node's address
        assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] == "0"  # for what this process starts


@pytest.mark.slow
def test_the_jobs_alive_include_this_driver(ray_session):
    import ray

    assert ray.get_runtime_context().get_job_id() in ray_adapter.live_job_ids()


def test_the_names_folder_is_in_the_session_where_tune_stages_a_drivers_files(ray_session, tmp_path):
    from ray.train._internal.storage import StorageContext

    staging = StorageContext(str(tmp_path), "sweep-1").experiment_driver_staging_path
    names = ray_adapter.session_names_dir()
    session = os.path.dirname(names)
    assert os.path.basename(names) == "accelsweep-experiments" and os.path.isdir(session)
    assert staging.startswith(session + os.sep) and staging.endswith(os.sep.join(("sweep-1", "driver_artifacts")))


def test_tunes_loop_is_changed_only_inside_the_shared_cluster_context_and_put_back():
    from ray.tune.execution.insufficient_resources_manager import _InsufficientResourcesManager
    from ray.tune.execution.tune_controller import TuneController

    names = ("_maybe_cache_trial_actor", "on_step_end", "_update_trial_queue")
    before = [getattr(TuneController, name) for name in names]
    warn_before = _InsufficientResourcesManager.on_no_available_trials
    with ray_adapter.tune_sharing_a_cluster(lambda: False):
        assert all(getattr(TuneController, name) is not original for name, original in zip(names, before))
        # Tune's "insufficient resources" check, with no trial yet (the first waits for a seat): nothing.
        assert _InsufficientResourcesManager.on_no_available_trials(object(), []) is None

        class Controller:  # what the patched caching reads of Tune's controller
            pass

        assert TuneController._maybe_cache_trial_actor(Controller(), trial=None) is False  # reuse not allowed
    assert [getattr(TuneController, name) for name in names] == before
    assert _InsufficientResourcesManager.on_no_available_trials is warn_before
