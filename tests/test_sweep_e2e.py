"""Whole sweeps on local Ray into a temporary sqlite MLflow store, read back through
the MLflow client."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO


def mlflow_runs(uri, experiment, confirmations=False):
    """(parent runs, trial runs) of ``experiment``: the search's trials, or with
    ``confirmations`` the confirmation phase's (sweeps/driver/run/confirm.py)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags
                and (r.data.tags.get("phase") == "confirmation") == confirmations]
    return parents, children


# Lines of Ray's, Tune's and MLflow's own that the console of a sweep does not show
# (unless --verbose): banners, boxes, Ray's log lines, its workers' log markers.
NOT_THE_TOOLS = re.compile(r"Configuration for experiment|View detailed results here|Token authentication is|"
                           r"INFO mlflow|WARNING .*\.py:\d+ --|:job_id:|:actor_name:|╭|No CUDA runtime is found")


@pytest.fixture(scope="module")
def smoke_sweep(main_job):
    """The README's main job, --smoke, run once for the session (tests/conftest.py
    main_job): (tracking URI, its stdout, the folder of its store, its stderr)."""
    return main_job.tracking_uri, main_job.stdout, main_job.folder, main_job.stderr


@pytest.mark.slow
def test_the_console_shows_only_the_tools_lines(smoke_sweep):
    _, out, _, err = smoke_sweep
    foreign = [line for line in (out + err).splitlines() if NOT_THE_TOOLS.search(line)]
    assert not foreign, "lines of Ray's, Tune's or MLflow's own on the console:\n" + "\n".join(foreign)
    # Said by the tool instead: the main job ran with Ray's default, token auth on.
    assert "started a local Ray instance" in out and "token auth on (RAY_AUTH_MODE=disabled opts out)" in out


@pytest.mark.slow
def test_the_local_ray_instances_session_folder_goes_with_the_sweep(smoke_sweep):
    _, out, _, _ = smoke_sweep
    session = re.search(r"started a local Ray instance \([^;]*; session (\S+);", out).group(1)
    assert session.startswith("/tmp/ray/session_") and not os.path.exists(session)
    latest = "/tmp/ray/session_latest"
    assert not (os.path.islink(latest) and os.path.realpath(latest) == session)


@pytest.mark.slow
def test_main_job_smoke_sweep_lands_in_mlflow(smoke_sweep):
    uri, out, _, _ = smoke_sweep
    assert "baseline" in out and "best (trial" in out and "throughput (samples/s)" in out
    assert "$ per 1M samples" in out and "mean overhead per trial" in out
    assert f"mlflow ui --backend-store-uri {uri}" in out

    parents, children = mlflow_runs(uri, "X")
    # The main job confirms its verdict: the baseline and its best configs run again, taking
    # turns a window each (sweeps/driver/run/confirm.py): a trial per config, its windows the rounds.
    _, confirmations = mlflow_runs(uri, "X", confirmations=True)
    reused = [r for r in children if r.data.tags["status"] == "reused"]  # repeated proposals: answered, not run
    assert all(r.data.tags["reused_from_trial"] for r in reused)
    assert len(parents) == 1 and len(children) - len(reused) == 4
    parent_id = parents[0].info.run_id
    assert 2 <= len(confirmations) <= 4 and {r.data.tags["confirm_round"] for r in confirmations} == {"turns"}
    assert sum(r.data.tags["baseline"] == "true" for r in confirmations) == 1
    windows = [json.loads(r.data.tags["turn_figures"]) for r in confirmations]
    assert [len(w) for w in windows] == [6] * len(confirmations), windows  # 3 rounds x the smoke's 2 windows
    assert all(figure > 0 for w in windows for figure, _ in w)
    assert parents[0].data.tags["verdict"].startswith(("confirmed: ", "not decided: "))
    assert "take turns" in out and "6 rotated rounds" in out
    assert f"confirmation: 6 interleaved round(s), {len(confirmations)} trial(s)" in out
    assert "search (one trial per config): " in out
    # The near-best margin the candidates were chosen within is the run's own, as said and recorded.
    said = re.search(r"near the search's best: within ([\d.]+)%: twice this run's figure noise", out)
    margin = parents[0].data.metrics.get("near_best_margin_pct")
    if said:  # three quiet trials measured the run's noise (a contended one does not count)
        assert margin == pytest.approx(float(said.group(1)), abs=0.05), (margin, said.group(0))
    else:
        assert margin is None, margin
    searched = ["batch_size", "num_workers", "precision", "patch_embed", "threads", "channels_last"]
    for run in children:
        if run in reused:
            continue
        metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
        assert tags["mlflow.parentRunId"] == parent_id
        assert run.info.status == "FINISHED", tags.get("error")
        assert metrics["throughput_samples_per_s"] > 0
        assert math.isfinite(metrics["usd_per_1m_samples"])
        assert metrics["step_time_p50_s"] > 0
        if tags["status"] == "rejected":  # stopped by its first steps: a projection, and why
            assert "more than 3x worse" in tags["rejection"] and metrics["windows_done"] == 0
            continue
        assert math.isfinite(metrics["final_loss"])
        assert metrics["trial_cost_usd"] > 0 and metrics["overhead_s"] >= 0
        for knob in searched:
            assert knob in params
        assert tags["platform"] == "cpu" and tags["version.torch"] and tags["version.ray"]
        assert "$0.357/h" in tags["cost_basis"]
        # How far from the hardware's limit: model FLOPs x throughput against this CPU's
        # peak for the trial's precision, measured here, and the theoretical one.
        assert metrics["model_flops_per_item"] > 0 and "flop_counter" in tags["flops_method"]
        assert metrics["model_tflops"] == pytest.approx(
            metrics["model_flops_per_item"] * metrics["throughput_samples_per_s"] / 1e12, rel=1e-6)
        assert 0 < metrics["mfu"] == pytest.approx(metrics["model_tflops"] / metrics["peak_tflops"], rel=1e-6)
        assert tags["peak_basis"].startswith("measured here:") and metrics["peak_measured"] == 1.0
        assert "FLOP/cycle" in tags["peak_theoretical_basis"] and metrics["peak_tflops_theoretical"] > 0
    # The summary says the best config's utilisation, both peaks beside it.
    assert re.search(r"utilisation: best \(trial \d+\) at [\d.e-]+ TFLOP/s = [\d.]+% of this CPU's attainable "
                     r"\w+ peak \([\d.e-]+ TFLOP/s measured here\), [\d.]+% of its theoretical", out), out[-3000:]
    assert "  peak: measured here: " in out and "  model FLOPs: " in out
    baselines = [r for r in children if r.data.tags["baseline"] == "true"]
    assert len(baselines) == 1
    assert baselines[0].data.params["batch_size"] == "16" and baselines[0].data.params["precision"] == "fp32"


def failing_for_batch_8(searched, base, cost=None):
    print(f"a line of trial output at batch_size={searched['batch_size']}", file=sys.stderr, flush=True)
    os.write(1, b"a C library's line\n")  # below Python: the file descriptor itself
    if searched["batch_size"] == 8:
        raise RuntimeError("injected failure for batch_size=8")
    from accelsweep.trainables.trainable import train_trainable

    train_trainable(searched, base, cost)


@pytest.mark.slow
def test_failed_trials_are_recorded_and_the_sweep_goes_on(ray_session, tracking_uri):
    import ray.cloudpickle

    from accelsweep import Sweep, run_sweep
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.cost import resolve_cost_basis
    from accelsweep.trainables.metrics import TRAINING_METRICS

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests/
    basis, note = resolve_cost_basis(price_per_hour=0.357, local_units={"CPU": 2}, detect=False)
    lines = []
    result = run_sweep(Sweep(
        name="failing", trainable=failing_for_batch_8, metrics=TRAINING_METRICS,
        base=TrialConfig.make(model="vit-micro", cpus_per_worker=2, batch_size=16, warmup_steps=1,
                              window_min_steps=2, window_min_s=0.05, windows=1),
        space=lambda trial: {"batch_size": trial.suggest_categorical("batch_size", [8, 16])},
        num_samples=3, scheduler="none", tracking_uri=tracking_uri, cost=basis, cost_note=note,
        print_line=lines.append,
    ))
    statuses = sorted(r.status for r in result.records if r.status != "reused")
    # Two configs: each runs once (the failing one is not run again), then the space is used up.
    assert statuses == ["failed", "finished"]
    assert "search: 2 of 3 planned trials ran; the searcher ran out of new configs" in result.summary
    assert result.baseline is not None and result.baseline.status == "finished"
    assert re.search(r"failures by cause: error x\d \(RuntimeError\)", result.summary), result.summary
    _, children = mlflow_runs(tracking_uri, "failing")
    failed = [r for r in children if r.info.status == "FAILED"]
    assert len([r for r in children if r.data.tags["status"] != "reused"]) == 2 and failed
    for run in failed:
        assert run.data.tags["error_class"] == "RuntimeError"
        assert "injected failure for batch_size=8" in run.data.tags["error"]
    assert any("FAILED (error): RuntimeError" in line for line in lines)
    # Each trial's output is in its run; the console shows it for the failed trial only.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    for run in children:
        if run.data.tags["status"] == "reused":
            continue
        batch_size = run.data.params["batch_size"]
        assert run.data.tags["trial_output"] == "trial-output.log"
        kept = open(client.download_artifacts(run.info.run_id, "trial-output.log")).read()
        assert f"a line of trial output at batch_size={batch_size}" in kept and "a C library's line" in kept
    console = "\n".join(lines)
    assert "a line of trial output at batch_size=8" in console
    assert "a line of trial output at batch_size=16" not in console


TUNE_BOOKKEEPING = {"training_iteration", "pid", "iterations_since_restore", "time_total_s", "time_this_iter_s",
                    "timestamp", "time_since_restore", "timesteps_total", "done"}


@pytest.mark.slow
def test_trial_runs_hold_curves_of_the_windows_and_no_tune_bookkeeping(smoke_sweep):
    from mlflow.tracking import MlflowClient

    uri, _, _, _ = smoke_sweep
    _, children = mlflow_runs(uri, "X")
    client = MlflowClient(uri)
    ran = [r for r in children if r.data.tags["status"] == "finished"]
    assert ran
    for run in ran:
        assert not TUNE_BOOKKEEPING & set(run.data.metrics), sorted(run.data.metrics)
        windows = int(run.data.metrics["windows_done"])
        curve = client.get_metric_history(run.info.run_id, "window_throughput_samples_per_s")
        # One point per window, at steps 1..N: no step-0 copy of the final value first.
        assert sorted(p.step for p in curve) == list(range(1, windows + 1))
        last = {p.key: p.step for key in ("throughput_samples_per_s", "step_time_p50_s")
                for p in client.get_metric_history(run.info.run_id, key)}
        assert set(last.values()) == {windows}  # the trial's figures are logged at its last window
        assert run.data.tags["device"].startswith("cpu") and run.data.tags["unit"] == "samples"


def _report_table(text):
    """The report's baseline-vs-best table: row label -> (baseline cell, best cell)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4:
            rows[cells[0]] = (cells[1], cells[2])
    return rows


@pytest.mark.slow
def test_the_report_and_plots_are_on_the_parent_run_with_the_trial_runs_numbers(smoke_sweep):
    from mlflow.tracking import MlflowClient

    from accelsweep.trainables.metrics import TRAINING_METRICS

    uri, out, folder, _ = smoke_sweep
    parents, children = mlflow_runs(uri, "X")
    parent = parents[0]
    client = MlflowClient(uri)
    listed = {a.path for a in client.list_artifacts(parent.info.run_id)}
    plots = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"report.md", "report.html", "plots"} <= listed, listed
    assert plots == {f"plots/{name}.png"
                     for name in ("tradeoff", "progress", "importance", "parallel", "curves", "utilisation")}
    assert (folder / "mlartifacts").is_dir()  # artifacts live beside the sqlite store
    report = open(client.download_artifacts(parent.info.run_id, "report.md", str(folder))).read()
    table = _report_table(report)
    best_number = int(re.search(r"best \(trial (\d+)\)", report).group(1))
    by_number = {int(r.data.tags["trial_number"]): r for r in children}
    best, baseline = by_number[best_number], next(r for r in children if r.data.tags["baseline"] == "true")
    assert int(parent.data.tags["best_trial"]) == best_number
    checked = 0
    for metric in TRAINING_METRICS.summarised:
        if metric.label in table and math.isfinite(best.data.metrics.get(metric.name, math.nan)):
            assert table[metric.label][1] == metric.fmt.format(best.data.metrics[metric.name]), metric.name
            assert table[metric.label][0] == metric.fmt.format(baseline.data.metrics[metric.name]), metric.name
            checked += 1
    assert checked >= 8
    assert f"utilisation: best (trial {best_number}) at " in report  # and where it stands against the peak
    html = open(client.download_artifacts(parent.info.run_id, "report.html", str(folder))).read()
    assert '<img src="plots/tradeoff.png"' in html and "<table>" in html
    assert '<img src="plots/utilisation.png"' in html
    assert "report: report.md, report.html" in out


@pytest.mark.slow
def test_the_optuna_study_holds_one_trial_per_tune_trial(smoke_sweep):
    import optuna

    uri, _, folder, _ = smoke_sweep
    parents, children = mlflow_runs(uri, "X")
    tags = parents[0].data.tags
    assert tags["optuna_storage"] == f"sqlite:///{folder}/m.optuna.db"
    study = optuna.load_study(study_name=tags["optuna_study"], storage=tags["optuna_storage"])
    assert study.study_name == parents[0].info.run_name
    ran = {r.info.run_id: r for r in children if r.data.tags["status"] != "reused"}
    trials = {t.user_attrs["mlflow_run_id"]: t for t in study.trials}
    assert set(trials) == set(ran)
    states = {"finished": optuna.trial.TrialState.COMPLETE, "failed": optuna.trial.TrialState.FAIL,
              "stopped early": optuna.trial.TrialState.PRUNED, "rejected": optuna.trial.TrialState.PRUNED}
    for run_id, run in ran.items():
        trial = trials[run_id]
        assert trial.state == states[run.data.tags["status"]]
        assert trial.user_attrs["trial_number"] == int(run.data.tags["trial_number"])
        assert trial.params == json.loads(run.data.tags["searched"])
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert trial.value == run.data.metrics["throughput_samples_per_s"]


@pytest.mark.slow
def test_the_report_rebuilds_from_the_store_alone(smoke_sweep, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, out, folder, _ = smoke_sweep
    parents, _ = mlflow_runs(uri, "X")
    name, run_id = parents[0].info.run_name, parents[0].info.run_id
    # The report's count of trials and seconds is the console's, to the second.
    said = re.search(r"^== neuron_vit on cpu: (\d+ trials in \d+ s) ", out, re.M).group(1)
    done = subprocess.run([sys.executable, "sweeps/driver/reporting/report_command.py", name, "--tracking-uri", uri, "--out",
                           str(tmp_path / "out"), "--no-log"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = open(MlflowClient(uri).download_artifacts(run_id, "report.md", str(tmp_path))).read()
    assert (tmp_path / "out" / "report.md").read_text() == logged  # the same record, the same report
    assert f"neuron_vit on cpu: {said} " in logged, (said, logged[:300])
    assert (tmp_path / "out" / "plots" / "tradeoff.png").stat().st_size > 10_000
    unknown = subprocess.run([sys.executable, "sweeps/driver/reporting/report_command.py", "no-such-sweep", "--tracking-uri", uri],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert f"error: sweep must be the run id or run name of one sweep's parent run (the newest: {name}); got " \
           "'no-such-sweep'" in unknown.stderr


@pytest.mark.slow
def test_remeasure_runs_each_config_again_as_trials_of_its_own(ray_session, tracking_uri):
    from accelsweep import Sweep, remeasure, run_sweep
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.metrics import TRAINING_METRICS
    from accelsweep.trainables.trainable import train_trainable

    sweep = Sweep(name="again", trainable=train_trainable, metrics=TRAINING_METRICS,
                  base=TrialConfig.make(model="vit-micro", cpus_per_worker=1, batch_size=8, warmup_steps=1,
                                        window_min_steps=2, window_min_s=0.05, windows=2),
                  space=lambda trial: {"batch_size": trial.suggest_categorical("batch_size", [4, 8])},
                  tracking_uri=tracking_uri, print_line=lambda line: None)
    result = run_sweep(remeasure(sweep, [{"batch_size": 8}, {"batch_size": 4}], times=2))
    ran = [r for r in result.records if r.status != "reused"]
    assert [r.searched["batch_size"] for r in ran] == [8, 4, 8, 4]  # interleaved, none answered from another
    assert all(r.status == "finished" for r in ran)
    _, children = mlflow_runs(tracking_uri, "again-remeasure")
    assert len(children) == 4 and {r.data.tags["searched"] for r in children} == {'{"batch_size": 8}',
                                                                                  '{"batch_size": 4}'}
