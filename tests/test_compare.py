"""Comparing sweeps (sweeps/driver/reporting/comparison.py, sweeps/driver/reporting/compare_command.py): the sentence and the
table on hand-built sweep histories, bad input, and the command on two real CPU smoke
sweeps priced differently, its verdict checked against the trial runs in MLflow."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from accelsweep.sweeps.driver.run.callbacks import TrialRecord
from accelsweep.sweeps.driver.reporting.comparison import (COMPARISON_FILES, cheaper_sentence, compare_histories, compare_sweeps,
                                              comparison_plot, entry)
from accelsweep.sweeps.driver.record.history import SweepHistory
from accelsweep.sweeps.driver.reporting.summary import plain
from accelsweep.trainables.cost import NO_BASIS_HINT
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import KERNEL_METRICS, TRAINING_METRICS, training_metrics
from tests.conftest import REPO

NAN = float("nan")
CPU = "AMD EPYC, 2 cores, 1 NUMA node(s)"


def trial(number, samples_per_s, usd_per_1m, cv=0.01, baseline=False, status="finished", **knobs):
    knobs = knobs or {"batch_size": 16}
    result = {"throughput_samples_per_s": samples_per_s, "usd_per_1m_samples": usd_per_1m, "throughput_cv": cv,
              "step_time_p50_s": 16 / samples_per_s, "compile_s": 0.0, "device": "cpu: test"}
    return TrialRecord(number, f"t{number}", dict(knobs), dict(knobs), {"CPU": 2.0}, baseline, 0.0,
                       run_id=f"run{number}", status=status, result=result, measured_by="throughput_samples_per_s")


def sweep(name, records, price="price basis: $1/h given on the command line", store="sqlite:////tmp/x/m.db",
          hardware=CPU, knobs=("batch_size",), metrics=TRAINING_METRICS, **base):
    params = {"base.platform": "cpu", "base.model": "vit-micro", "base.batch_size": "16",
              **{f"base.{k}": str(v) for k, v in base.items()}}
    tags = {"sweep": "neuron_vit", "platform": "cpu", "instance_type": "unknown", "cost_basis": price,
            "hardware": hardware}
    return SweepHistory(tracking_uri=store, experiment_id="1", parent_run_id=f"id-{name}", name=name, params=params,
                        tags=tags, figures={}, records=list(records), objectives=[("throughput_samples_per_s", "max")],
                        knobs=list(knobs), metrics=metrics, elapsed_s=10.0, started_ms=1_700_000_000_000)


def test_names_the_cheaper_per_sample_and_by_how_much():
    slow_cheap = sweep("a", [trial(1, 100.0, 0.5)])
    fast_dear = sweep("b", [trial(1, 400.0, 2.0)])
    sentence, cheapest = cheaper_sentence([entry(fast_dear), entry(slow_cheap)])
    assert cheapest.name == "a"
    assert sentence.startswith("a is cheaper per sample: $0.5 per 1M samples against $2 for b")
    assert "4.00x as much" in sentence and "75% less" in sentence
    assert "beyond the measured noise" in sentence


def test_a_difference_within_the_noise_is_said_to_be_no_difference():
    a = sweep("a", [trial(1, 100.0, 1.0, cv=0.2)])
    b = sweep("b", [trial(1, 100.0, 1.1, cv=0.2)])
    sentence, cheapest = cheaper_sentence([entry(a), entry(b)])
    assert cheapest.name == "a"
    assert "within the measured noise" in sentence and "not significant" in sentence


def test_the_best_is_the_best_by_the_first_objective_not_the_cheapest_trial():
    # a's fastest trial costs more than its slower one: the best config is the fastest
    a = sweep("a", [trial(1, 100.0, 0.4, baseline=True), trial(2, 300.0, 0.9, batch_size=32)])
    b = sweep("b", [trial(1, 200.0, 0.6)])
    comparison = compare_histories([a, b])
    assert comparison.cheapest.name == "b"
    assert comparison.entries[0].best.number == 2
    assert any("In a, trial 1 was cheaper per sample than its best ($0.4 against $0.9" in n for n in comparison.notes)


def test_a_sweep_without_price_basis_is_named_and_nothing_is_called_cheaper():
    priced = sweep("priced", [trial(1, 100.0, 0.5)])
    unpriced = sweep("unpriced", [trial(1, 300.0, NAN)], price=NO_BASIS_HINT)
    comparison = compare_histories([priced, unpriced])
    assert comparison.cheapest is None
    assert comparison.sentence.startswith("Cannot say which is cheaper per sample: unpriced: it ran with no price basis")
    table = plain(comparison.blocks)
    assert re.search(r"price basis\s+\$1/h given on the command line\s+no price basis", table)


def test_among_several_the_priced_ones_are_ranked_and_the_unpriced_named():
    histories = [sweep("a", [trial(1, 100.0, 0.8)]), sweep("b", [trial(1, 100.0, NAN)], price=NO_BASIS_HINT),
                 sweep("c", [trial(1, 100.0, 0.2)]), sweep("d", [trial(1, 100.0, 0.3)])]
    sentence, cheapest = cheaper_sentence([entry(h) for h in histories])
    assert cheapest.name == "c"
    assert sentence.startswith("Among the priced sweeps, c is the cheapest per sample: $0.2 per 1M samples; "
                               "d 1.50x ($0.3), a 4.00x ($0.8) as much.")
    assert "measured noise of the best configs of c and d" in sentence
    assert "Not compared: b: it ran with no price basis" in sentence


def test_a_sweep_that_measured_nothing_cannot_be_compared():
    failed = trial(1, NAN, NAN, status="failed")
    sentence, cheapest = cheaper_sentence([entry(sweep("a", [trial(1, 100.0, 0.5)])), entry(sweep("b", [failed]))])
    assert cheapest is None
    assert "b: no trial of it measured throughput_samples_per_s" in sentence


def test_a_kernel_sweep_is_shown_but_not_priced(tmp_path):
    kernel = sweep("nms", [trial(1, 100.0, NAN)], metrics=KERNEL_METRICS, knobs=("impl",))
    kernel.objectives = [("latency_p50_s", "min")]
    kernel.records[0].result.update(latency_p50_s=0.001)
    comparison = compare_histories([sweep("vit", [trial(1, 100.0, 0.5)]), kernel])
    assert comparison.cheapest is None
    assert "nms: it reports no $ per 1M figure" in comparison.sentence
    assert any("best by different objectives" in n for n in comparison.notes)
    assert comparison_plot(comparison, str(tmp_path / "c.png")).endswith("c.png")


def test_sweeps_pricing_different_units_are_not_compared():
    tokens = sweep("lm", [trial(1, 100.0, 0.5)], metrics=training_metrics("tokens"))
    tokens.records[0].result.update(throughput_tokens_per_s=5000.0, usd_per_1m_tokens=0.01)
    sentence, cheapest = cheaper_sentence([entry(sweep("vit", [trial(1, 100.0, 0.5)])), entry(tokens)])
    assert cheapest is None
    assert "the sweeps price different units (vit per 1M samples, lm per 1M tokens)" in sentence


def test_different_hardware_and_workloads_are_said():
    cpu = sweep("cpu", [trial(1, 100.0, 0.5)], model="vit-micro")
    other = sweep("other", [trial(1, 50.0, 0.5)], hardware="Intel Xeon, 8 cores", model="vit-tiny", batch_size=64)
    notes = compare_histories([cpu, other]).notes
    assert any(n.startswith("Different hardware (") and "AMD EPYC" in n and "Intel Xeon" in n for n in notes)
    workload = next(n for n in notes if n.startswith("Different workloads"))
    assert "model: vit-micro vs vit-tiny" in workload
    assert "batch_size" not in workload  # a searched knob: its base value is the baseline's, not the workload


def test_same_hardware_and_workload_is_said_too():
    notes = compare_histories([sweep("a", [trial(1, 100.0, 0.5)]), sweep("b", [trial(1, 90.0, 2.0)])]).notes
    assert notes == [f"Same hardware (platform cpu, instance type unknown, {CPU}) and workload: the sweeps differ "
                     "in their price basis and in what they measured."]


def test_the_table_has_a_column_per_sweep_and_the_union_of_knobs():
    a = sweep("a", [trial(1, 100.0, 0.5, batch_size=32, threads=2)], knobs=("batch_size", "threads"))
    b = sweep("b", [trial(1, 90.0, 2.0, batch_size=16, channels_last=True)], knobs=("channels_last",))
    rows = {row[0]: row[1:] for row in compare_histories([a, b]).blocks[2].rows}
    assert rows[""] == ("a", "b")
    assert rows["batch_size"] == ("32", "16 (fixed)")  # b did not search it: its config's value
    assert rows["threads"] == ("2", "")
    assert rows["channels_last"] == ("", "True")
    assert rows["throughput (samples/s)"] == ("100.00", "90.00")
    assert rows["$ per 1M samples"] == ("0.5000", "2.0000")
    assert rows["step time p50 (s)"] == ("0.1600", "0.1778")
    assert rows["trials measured"] == ("1 of 1", "1 of 1")
    for label in ("instance type", "price basis", "platform", "device", "compile (s)"):
        assert label in rows


def test_the_plot_is_written_with_an_unpriced_sweep(tmp_path):
    """Its n/a says why in a few words: the whole hint (how to give a price basis) once ran
    across the other panel, and the layout collapsed (matplotlib warned of it)."""
    import warnings

    comparison = compare_histories([sweep("a", [trial(1, 100.0, 0.5)]),
                                    sweep("b", [trial(1, 300.0, NAN)], price=NO_BASIS_HINT)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied because axes sizes collapsed to zero"
        path = comparison_plot(comparison, str(tmp_path / "c.png"))
    with open(path, "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("histories, hint", [
    ([], ""),
    (["a"], ""),
    (["a", "a"], "a is given twice"),
])
def test_bad_sets_of_histories(histories, hint):
    made = {"a": sweep("a", [trial(1, 100.0, 0.5)])}
    with pytest.raises(ConfigError) as error:
        compare_histories([made[n] for n in histories])
    assert error.value.field == "sweeps" and hint in str(error.value)


def test_sweeps_of_two_stores_are_refused():
    a = sweep("a", [trial(1, 100.0, 0.5)], store="sqlite:////tmp/one/m.db")
    b = sweep("b", [trial(1, 100.0, 0.5)], store="sqlite:////tmp/two/m.db")
    with pytest.raises(ConfigError, match="sweeps must be sweeps of one tracking store") as error:
        compare_histories([a, b])
    assert error.value.field == "sweeps"


@pytest.mark.parametrize("refs, hint", [("one-name", ""), (["one-name"], ""), (["x", "x"], "x is given twice")])
def test_bad_refs_are_refused_before_reading_the_store(refs, hint):
    with pytest.raises(ConfigError) as error:
        compare_sweeps("sqlite:////nonexistent-dir/m.db", refs)
    assert error.value.field == "sweeps" and hint in str(error.value)


def run_compare(*args, env=None):
    return subprocess.run([sys.executable, "sweeps/driver/reporting/compare_command.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow
def test_the_command_ends_bad_input_with_the_message_and_status_2(tmp_path):
    done = run_compare("only-one", "--tracking-uri", f"sqlite:///{tmp_path}/m.db")
    assert done.returncode == 2
    assert "error: sweeps must be two or more sweeps" in done.stderr and "Traceback" not in done.stderr


# --- two real CPU smoke sweeps, priced differently -------------------------------------------------------------

@pytest.fixture(scope="module")
def two_sweeps(main_job, second_sweep):
    """The shared run of the main job (priced at its price) and the session's second one
    (warm started from it, priced at its own), in one store: (tracking URI, {price: parent run})."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(second_sweep.tracking_uri)
    parents = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 filter_string="tags.kind = 'sweep'")
    by_price = {float(re.search(r"\$([\d.]+)/h", p.data.tags["cost_basis"]).group(1)): p for p in parents}
    assert sorted(by_price) == sorted([main_job.price_per_hour, second_sweep.price_per_hour])
    return second_sweep.tracking_uri, by_price


def best_usd_per_1m(client, parent) -> float:
    """The $ per 1M samples of the sweep's best trial, as the driver recorded it: the
    parent run's best_trial tag, that trial run's metric."""
    number = parent.data.tags["best_trial"]
    trials = client.search_runs([parent.info.experiment_id],
                                filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' and "
                                              f"tags.trial_number = '{number}'")
    assert len(trials) == 1
    return trials[0].data.metrics["usd_per_1m_samples"]


@pytest.mark.slow
def test_the_command_names_the_cheaper_of_two_sweeps_and_logs_the_comparison(two_sweeps, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, by_price = two_sweeps
    client = MlflowClient(uri)
    parents = [by_price[p] for p in sorted(by_price)]
    names = [p.info.run_name for p in parents]
    done = run_compare(names[0], parents[1].info.run_id, "--tracking-uri", uri)  # by name, and by id
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    costs = {p.info.run_name: best_usd_per_1m(client, p) for p in parents}
    cheaper = min(costs, key=costs.get)
    assert costs[cheaper] < max(costs.values())
    header = next(line for line in done.stdout.splitlines() if line.strip().startswith(names[0]))
    assert names[1] in header
    assert f"{cheaper} is cheaper per sample: ${costs[cheaper]:.4g} per 1M samples against " in done.stdout
    for price in by_price:
        assert f"${price:g}/h given on the command line" in done.stdout

    run_id = re.search(r"logged the comparison as MLflow run (\w+)", done.stdout).group(1)
    runs = client.search_runs([parents[0].info.experiment_id], filter_string="tags.kind = 'comparison'")
    assert [r.info.run_id for r in runs] == [run_id]
    run = runs[0]
    assert run.info.run_name == f"compare {names[0]} {names[1]}"
    assert run.data.tags["compared_runs"] == f"{parents[0].info.run_id},{parents[1].info.run_id}"
    assert run.data.tags["cheaper_per_sample"] == cheaper
    assert sorted(a.path for a in client.list_artifacts(run_id)) == sorted(COMPARISON_FILES)
    with open(client.download_artifacts(run_id, "comparison.md", str(tmp_path))) as md:
        text = md.read()
    assert all(name in text for name in names) and f"{cheaper} is cheaper per sample" in text


@pytest.mark.slow
def test_one_sweep_given_by_name_and_by_id_is_refused(two_sweeps):
    uri, by_price = two_sweeps
    parent = by_price[min(by_price)]
    with pytest.raises(ConfigError, match="is given twice") as error:
        compare_sweeps(uri, [parent.info.run_name, parent.info.run_id])
    assert error.value.field == "sweeps"


@pytest.mark.slow
def test_an_unknown_sweep_ends_the_command_with_status_2(two_sweeps):
    uri, by_price = two_sweeps
    done = run_compare(by_price[min(by_price)].info.run_name, "no-such-sweep", "--tracking-uri", uri, "--no-log")
    assert done.returncode == 2
    assert "error: sweep must be the run id or run name of one sweep's parent run" in done.stderr
    assert "'no-such-sweep'" in done.stderr and "Traceback" not in done.stderr


def test_a_base_field_an_older_sweep_did_not_record_is_its_default_not_a_different_workload():
    """Two H100 sweeps compared: the older one, recorded before placement_strategy existed,
    read as '(none) vs PACK', a different workload, though it ran with PACK."""
    from accelsweep.sweeps.driver.reporting.comparison import _base_param

    older, newer = {"base.batch_size": "16"}, {"base.batch_size": "16", "base.placement_strategy": "PACK"}
    assert _base_param(older, "base.placement_strategy") == _base_param(newer, "base.placement_strategy") == "PACK"
    assert _base_param(older, "base.no_such_field") == "(none)"
    assert _base_param({"base.placement_strategy": "SPREAD"}, "base.placement_strategy") == "SPREAD"
