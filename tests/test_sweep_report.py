"""The sweep report's parts that read a real Optuna study or a user's trial results
(sweeps/driver/reporting/report_artifacts.py): the device stamped on its plots, and knob importance
ranked for the objective's direction."""

from __future__ import annotations

import itertools

import optuna
import pytest

from accelsweep.sweeps.driver.record.history import SweepHistory
from accelsweep.sweeps.driver.record.trial_record import TrialRecord
from accelsweep.sweeps.driver.reporting.report_artifacts import _stamp, knob_importances
from accelsweep.sweeps.driver.reporting.verdict import sweep_answer
from accelsweep.trainables.metrics import Metric, MetricSet

METRICS = MetricSet(metrics=(Metric("score", "", "max", label="score", progress="{:.1f}"),), headline=("score",))


def history(records=(), tags=None, objectives=(("score", "max"),)) -> SweepHistory:
    return SweepHistory(tracking_uri="sqlite:////tmp/x/m.db", experiment_id="1", parent_run_id="p", name="s-1",
                        params={}, tags={"sweep": "s", "platform": "cpu", **(tags or {})}, figures={},
                        records=list(records), objectives=list(objectives), knobs=["a", "b"], metrics=METRICS,
                        elapsed_s=1.0, started_ms=1_700_000_000_000)


def record(number, score, **result):
    return TrialRecord(number, f"t{number}", {}, {}, {}, number == 1, 0.0, status="finished",
                       result={"score": score, **result})


def device_stamp(sweep: SweepHistory) -> str:
    return _stamp(sweep, sweep_answer(sweep.records, sweep.confirmations, *sweep.objectives[0]).best).device


def test_the_device_stamp_says_what_is_true():
    assert device_stamp(history([record(1, 1.0, device="cpu: AMD EPYC")])) == "cpu: AMD EPYC"
    # A user's trainable that reports no device still measured: it is not "no trial measured".
    assert device_stamp(history([record(1, 1.0), record(2, 2.0)])) == "not reported by the trainable"
    assert device_stamp(history([record(1, float("nan"))])) == "no trial measured"


def synthetic_study(url, directions):
    """Knob ``a`` decides the best trials (a == 3 gives the top score), knob ``b`` the
    worst (b == 0 gives the bottom one): importance for the right direction ranks ``a``
    first, for the wrong one ``b``. The first objective goes ``directions[0]``'s way."""
    study = optuna.create_study(storage=url, study_name="synthetic", directions=directions)
    sign = 1.0 if directions[0] == "maximize" else -1.0
    for repeat, a, b in itertools.product(range(3), range(4), range(4)):
        score = 10.0 * (a == 3) - 10.0 * (b == 0) + 0.01 * repeat
        trial = optuna.trial.create_trial(
            params={"a": a, "b": b},
            distributions={name: optuna.distributions.CategoricalDistribution([0, 1, 2, 3]) for name in "ab"},
            values=[sign * score] + [float(b)] * (len(directions) - 1))
        study.add_trial(trial)


@pytest.mark.slow  # importing Optuna's importance module takes 2 s or more (scikit-learn)
@pytest.mark.parametrize("directions", [["maximize"], ["minimize"], ["maximize", "minimize"],
                                        ["minimize", "maximize"]])
def test_the_knob_that_makes_the_best_trials_ranks_first_in_every_direction(tmp_path, directions):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    synthetic_study(url, directions)
    importances, evaluator, note = knob_importances(history(tags={"optuna_storage": url, "optuna_study": "synthetic"}))
    assert evaluator == "PedAnovaImportanceEvaluator" and note == "from 48 complete trials of study synthetic"
    assert max(importances, key=importances.get) == "a", importances
    assert importances["a"] > 2 * importances["b"], importances


@pytest.mark.slow  # Optuna's importance module (scikit-learn)
def test_importances_from_no_more_trials_than_knobs_say_they_are_a_hint(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=url, study_name="few", directions=["maximize"])
    for a, b, c in ((0, 1, 2), (1, 2, 0), (2, 0, 1)):  # three trials, three knobs
        study.add_trial(optuna.trial.create_trial(
            params={"a": a, "b": b, "c": c}, values=[float(a)],
            distributions={name: optuna.distributions.CategoricalDistribution([0, 1, 2]) for name in "abc"}))
    importances, _, note = knob_importances(history(tags={"optuna_storage": url, "optuna_study": "few"}))
    assert set(importances) == {"a", "b", "c"}
    assert note == "from 3 complete trials of study few\nno more trials than the 3 knobs: a hint, not a ranking"


def test_a_kernel_sweeps_report_has_its_roofline_figure_and_line(tmp_path):
    import os

    from accelsweep.sweeps.driver.reporting.report_artifacts import PLOTS_DIR, build_report
    from accelsweep.trainables.metrics import KERNEL_METRICS
    from tests.test_roofline import matmul_trials

    kernel = history(matmul_trials(), objectives=(("latency_p50_s", "min"),))
    kernel.knobs, kernel.metrics = ["impl", "m", "k", "n"], KERNEL_METRICS
    written = build_report(kernel, str(tmp_path))
    roofline = next(path for path in written if os.path.basename(path) == "roofline.png")
    assert roofline == os.path.join(str(tmp_path), PLOTS_DIR, "roofline.png") and os.path.getsize(roofline)
    assert roofline.marked["compute_bound"] == (1, 2) and roofline.marked["memory_bound"] == (3, 5)
    report = (tmp_path / "report.md").read_text()
    assert "![roofline](plots/roofline.png)" in report
    assert "roofline, matmul m=512 k=512 n=512: best jax-dot (trial 2) at 80% of its roofline bound" in report
