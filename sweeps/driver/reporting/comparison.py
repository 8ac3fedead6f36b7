"""Sweeps side by side: the best config of each, what it measured and what it costs.

    from accelsweep.sweeps.driver.reporting.comparison import compare_sweeps, log_comparison
    comparison = compare_sweeps("sqlite:///mlflow.db", ["neuron_vit-20261123-170238", "neuron_vit-20261124-091500"])
    print(plain(comparison.blocks))
    run_id = log_comparison(comparison)  # comparison.md, .html and .png on a run of its own

The seed's instance-type question ("trn1.2xlarge or trn1.32xlarge, which is cheaper per
sample?") is a comparison of two sweeps of one study. Each sweep's best is its best trial
by its own first objective (as in its report), which need not be its cheapest: the
comparison says so. The sentence compares $ per 1M samples of the best configs, and says
what else differs (hardware, the base config's workload, the objective), since "cheaper"
across two machines and two models is not a statement about either. Everything is read
from the MLflow store (history.py), as the sweep report is.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import os
import re
import tempfile
import textwrap
from dataclasses import MISSING, dataclass, field
from typing import Any, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.record.trial_record import TrialRecord
from accelsweep.sweeps.driver.record.history import SweepHistory, load_sweep
from accelsweep.sweeps.driver.reporting.summary import Block, Table, best_record, html, markdown, ranked
from accelsweep.sweeps.driver.reporting.verdict import sweep_answer
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.cost import price_advice
from accelsweep.trainables.errors import ConfigError
from accelsweep.sweeps.driver.record.secrets import redact_uri
from accelsweep.sweeps.driver.record.tracking import mlflow_client

__all__ = ["COMPARISON_FILES", "Comparison", "Entry", "cheaper_sentence", "compare_histories", "compare_sweeps",
           "comparison_plot", "differences", "log_comparison", "write_comparison"]

COMPARISON_FILES = ("comparison.md", "comparison.html", "comparison.png")
# Base-config fields that say where a sweep ran, not what it ran: the hardware line says them.
HARDWARE_FIELDS = ("base.platform", "base.instance_type")
MAX_LISTED = 6  # differing base fields named in the workload note; the rest are counted


@dataclass(frozen=True)
class Entry:
    """One sweep of a comparison: its history and its answer (verdict.sweep_answer: the
    confirmation's pick, else its best trial by its first objective)."""

    history: SweepHistory
    best: Optional[TrialRecord]
    throughput_metric: Optional[str]  # throughput_samples_per_s (or _tokens_...); None: the sweep reports none
    cost_metric: Optional[str]  # usd_per_1m_samples (or _tokens); None: the sweep is not priced (kernel sweeps)

    @property
    def name(self) -> str:
        return self.history.name

    @property
    def unit(self) -> str:
        """What the sweep counts: "samples", "tokens"; "" when it reports no throughput."""
        metric = self.cost_metric or self.throughput_metric or ""
        found = re.fullmatch(r"usd_per_1m_(\w+)|throughput_(\w+)_per_s", metric)
        return (found.group(1) or found.group(2)) if found else ""

    def figure(self, metric: Optional[str]) -> float:
        return self.best.metric(metric) if self.best is not None and metric else float("nan")

    @property
    def usd_per_1m(self) -> float:
        return self.figure(self.cost_metric)

    @property
    def no_cost_reason(self) -> str:
        """Why this sweep has no $ per 1M figure to compare; "" when it has one."""
        if math.isfinite(self.usd_per_1m):
            return ""
        first = self.history.objectives[0][0]
        if self.best is None:
            return f"no trial of it measured {first}, its first objective"
        if self.cost_metric is None:
            return "it reports no $ per 1M figure (its trainable is not priced, as kernel sweeps are not)"
        if not self.history.cost_note or self.history.cost_note.startswith("no price basis"):
            return f"it ran with no price basis ({price_advice(self.history.cost_note)})"
        return f"its best trial has no {self.cost_metric} (price basis: {self.history.cost_note})"

    @property
    def cheapest(self) -> Optional[TrialRecord]:
        """Its measured trial with the lowest $ per 1M (a speed-ranked sweep's best may cost more)."""
        if self.cost_metric is None:
            return None
        return best_record(self.history.records, self.cost_metric, "min")


@dataclass
class Comparison:
    entries: list[Entry]
    sentence: str  # names the cheaper per sample (by how much), or says why it cannot
    cheapest: Optional[Entry]
    notes: list[str]  # what else differs between the sweeps, so the comparison is read correctly
    blocks: list[Block] = field(default_factory=list)  # title, table, sentence, notes: for plain/markdown/html

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @property
    def parent_run_ids(self) -> list[str]:
        return [e.history.parent_run_id for e in self.entries]

    @property
    def run_name(self) -> str:
        return "compare " + " ".join(self.names)


def _metric_names(history: SweepHistory) -> tuple[Optional[str], Optional[str]]:
    """(throughput, $ per 1M) of the sweep's declaration, in the unit it counts (its
    headline's first throughput: tokens for a language model, samples for ViT)."""
    throughputs = [m.name for m in history.metrics.metrics
                   if not m.curve and re.fullmatch(r"throughput_\w+_per_s", m.name)]
    throughput = throughputs[0] if throughputs else None
    names = history.metrics.names
    unit = throughput[len("throughput_"):-len("_per_s")] if throughput else ""
    costs = [n for n in names if n.startswith("usd_per_1m_")]
    cost = f"usd_per_1m_{unit}" if f"usd_per_1m_{unit}" in names else (costs[0] if costs else None)
    return throughput, cost


def entry(history: SweepHistory) -> Entry:
    throughput, cost = _metric_names(history)
    answer = sweep_answer(history.records, history.confirmations, *history.objectives[0])
    return Entry(history, answer.best, throughput, cost)


def _money(value: float) -> str:
    return f"${value:.4g}" if math.isfinite(value) else "n/a"


def cheaper_sentence(entries: Sequence[Entry]) -> tuple[str, Optional[Entry]]:
    """The sentence naming the cheapest per sample and by how much (beyond the measured
    noise or not), or why it cannot be said; and the cheapest entry (None then)."""
    unpriced = [e for e in entries if e.no_cost_reason]
    why_not = "; ".join(f"{e.name}: {e.no_cost_reason}" for e in unpriced)
    priced = [e for e in entries if not e.no_cost_reason]
    if len(priced) < 2:
        return f"Cannot say which is cheaper per sample: {why_not}.", None
    units = sorted({e.unit for e in priced})
    if len(units) > 1:
        counted = ", ".join(f"{e.name} per 1M {e.unit}" for e in priced)
        return f"Cannot say which is cheaper per sample: the sweeps price different units ({counted}).", None
    unit = units[0]
    ordered = sorted(priced, key=lambda e: e.usd_per_1m)
    cheapest, runner_up = ordered[0], ordered[1]
    among = "Among the priced sweeps, " if unpriced else ""
    if cheapest.usd_per_1m == runner_up.usd_per_1m:
        text = (f"{among}{cheapest.name} and {runner_up.name} cost the same per 1M {unit}: "
                f"{_money(cheapest.usd_per_1m)} per 1M {unit}.")
        return text + (f" Not compared: {why_not}." if unpriced else ""), None
    per = f"per {unit[:-1] if unit.endswith('s') else unit}"
    ratio = runner_up.usd_per_1m / cheapest.usd_per_1m
    if len(ordered) == 2:
        text = (f"{among}{cheapest.name} is cheaper {per}: {_money(cheapest.usd_per_1m)} per 1M {unit} against "
                f"{_money(runner_up.usd_per_1m)} for {runner_up.name}, which costs {ratio:.2f}x as much "
                f"({cheapest.name} costs {1 - 1 / ratio:.0%} less).")
    else:
        others = ", ".join(f"{e.name} {e.usd_per_1m / cheapest.usd_per_1m:.2f}x ({_money(e.usd_per_1m)})"
                           for e in ordered[1:])
        text = (f"{among}{cheapest.name} is the cheapest {per}: {_money(cheapest.usd_per_1m)} per 1M {unit}; "
                f"{others} as much.")
    # $ per 1M is the rate over the throughput: its spread is the throughput's.
    pair = "the two best configs" if len(ordered) == 2 else f"the best configs of {cheapest.name} and {runner_up.name}"
    noise = 2 * math.sqrt(cheapest.best.noise ** 2 + runner_up.best.noise ** 2)
    if not math.isfinite(noise):
        text += f" The measured noise of {pair} is unknown (one window per trial)."
    elif ratio - 1 > noise:
        text += f" The difference is beyond the measured noise of {pair} (+-{noise:.1%})."
    else:
        text += (f" The difference is within the measured noise of {pair} (+-{noise:.1%}): not significant; "
                 "measure again before choosing.")
    return text + (f" Not compared: {why_not}." if unpriced else ""), cheapest


def differences(entries: Sequence[Entry]) -> list[str]:
    """What differs between the sweeps besides their configs and prices: the hardware,
    the workload (the parent runs' base.* params, searched knobs aside), the objective,
    and a best config that is not its sweep's cheapest."""
    def hardware(e: Entry) -> str:
        tags = e.history.tags
        machine = tags.get("hardware") or (
            f"{tags.get('host.machine', 'unknown machine')}, {tags.get('host.cpus', '?')} CPUs")
        return f"platform {tags.get('platform', 'unknown')}, instance type {e.history.instance_type}, {machine}"

    def apart(values: Sequence[str]) -> str:
        return " vs ".join(values)

    notes = []
    machines = [hardware(e) for e in entries]
    if len(set(machines)) > 1:
        notes.append(f"Different hardware ({apart(machines)}): the comparison is of machines as much as configs.")
    searched = {k for e in entries for k in e.history.knobs}
    base_fields = sorted({k for e in entries for k in e.history.params if k.startswith("base.")}
                         - set(HARDWARE_FIELDS) - {f"base.{k}" for k in searched})
    differing = [k for k in base_fields if len({_base_param(e.history.params, k) for e in entries}) > 1]
    if differing:
        listed = "; ".join(f"{k[len('base.'):]}: {apart([_base_param(e.history.params, k) for e in entries])}"
                           for k in differing[:MAX_LISTED])
        more = f"; and {len(differing) - MAX_LISTED} more" if len(differing) > MAX_LISTED else ""
        notes.append(f"Different workloads: the base configs differ ({listed}{more}): a per-sample figure of one "
                     "is not a per-sample figure of the other.")
    if len(set(machines)) == 1 and not differing:
        notes.append(f"Same hardware ({machines[0]}) and workload: the sweeps differ in their price basis and "
                     "in what they measured.")
    objectives = [f"{mode} {metric}" for metric, mode in (e.history.objectives[0] for e in entries)]
    if len(set(objectives)) > 1:
        notes.append(f"Their best configs are best by different objectives ({apart(objectives)}).")
    for e in entries:
        cheapest = e.cheapest
        if cheapest is not None and e.best is not None and cheapest.metric(e.cost_metric) < e.usd_per_1m:
            notes.append(f"In {e.name}, trial {cheapest.number} was cheaper per {e.unit[:-1] or e.unit} than its "
                         f"best ({_money(cheapest.metric(e.cost_metric))} against {_money(e.usd_per_1m)} per 1M "
                         f"{e.unit}): its best is the best by {e.history.objectives[0][0]}.")
    return notes


def _base_param(params: Mapping[str, str], key: str) -> str:
    """A sweep's base.* param as recorded; a field its version did not record yet (a sweep
    from before ``placement_strategy`` existed) is the field's default, which it ran with."""
    if key in params:
        return params[key]
    default = _trial_config_defaults().get(key[len("base."):], MISSING)
    return "(none)" if default is MISSING else str(default)


@functools.lru_cache(maxsize=1)
def _trial_config_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(TrialConfig) if f.default is not MISSING}


def _price_basis(history: SweepHistory) -> str:
    note = history.cost_note
    return "no price basis" if not note or note.startswith("no price basis") else note.removeprefix("price basis: ")


def _shown(entry_: Entry, metric: Optional[str], with_unit: str = "") -> str:
    value = entry_.figure(metric)
    if not math.isfinite(value):
        return "n/a"
    fmt = entry_.history.metrics[metric].fmt if metric in entry_.history.metrics.names else "{:.4g}"
    return fmt.format(value) + (f" {with_unit}" if with_unit else "")


def comparison_table(entries: Sequence[Entry]) -> Table:
    """One column per sweep: where and how it ran, its best config's knobs (the union of
    the sweeps' knobs; "(fixed)" where a sweep did not search one, blank where its config
    lacks it), then the figures."""
    def row(label: str, cells) -> tuple[str, ...]:
        return (label, *(str(c) for c in cells))

    def knob_value(e: Entry, knob: str) -> str:
        if e.best is None or knob not in e.best.config:
            return ""
        value = str(e.best.config[knob])
        return value if knob in e.history.knobs else f"{value} (fixed)"

    def best_trial(e: Entry) -> str:
        if e.best is None:
            return "none measured"
        return f"{e.best.number}" + (" (baseline)" if e.best.is_baseline else "")

    knobs = list(dict.fromkeys(k for e in entries for k in e.history.knobs))
    one_unit = len({e.unit for e in entries}) == 1
    declared = entries[0].history.metrics

    def label(metric: Optional[str], fallback: str) -> str:
        """The first sweep's label ("throughput (samples/s)") when all count one unit."""
        return (declared[metric].label or fallback) if one_unit and metric in declared.names else fallback

    rows = [row("", (e.name for e in entries)),
            row("study", (e.history.tags.get("sweep", "") for e in entries)),
            row("platform", (e.history.tags.get("platform", "unknown") for e in entries)),
            row("instance type", (e.history.instance_type for e in entries)),
            row("price basis", (_price_basis(e.history) for e in entries)),
            row("best config priced as", (e.best.result.get("cost_basis", "") if e.best else "" for e in entries)),
            row("hardware", (e.history.tags.get("hardware", "") for e in entries)),
            row("device", (e.best.result.get("device", "") if e.best else "" for e in entries)),
            row("ranked by", (" ".join(reversed(e.history.objectives[0])) for e in entries)),
            row("best trial", (best_trial(e) for e in entries)),
            *(row(knob, (knob_value(e, knob) for e in entries)) for knob in knobs),
            row(label(entries[0].throughput_metric, "throughput"),
                (_shown(e, e.throughput_metric, "" if one_unit else f"{e.unit}/s") for e in entries)),
            row(label(entries[0].cost_metric, "$ per 1M"),
                (_shown(e, e.cost_metric, "" if one_unit else f"per 1M {e.unit}") for e in entries)),
            row("step time p50 (s)", (_shown(e, "step_time_p50_s") for e in entries)),
            row("compile (s)", (_shown(e, "compile_s") for e in entries)),
            row("trials measured", (f"{len(ranked(e.history.records, e.history.objectives[0][0]))} of "
                                    f"{len(e.history.records)}" for e in entries))]
    return Table(tuple(rows))


def compare_histories(histories: Sequence[SweepHistory]) -> Comparison:
    """The comparison of sweeps already read from one store (``load_sweep``)."""
    histories = list(histories)
    if len(histories) < 2:
        raise ConfigError("sweeps", "two or more sweeps", [h.name for h in histories])
    seen: dict[str, str] = {}
    for history in histories:
        if history.parent_run_id in seen:
            raise ConfigError("sweeps", "two or more different sweeps", [h.name for h in histories],
                              f"{history.name} is given twice (parent run {history.parent_run_id}).")
        seen[history.parent_run_id] = history.name
    stores = list(dict.fromkeys(h.tracking_uri for h in histories))
    if len(stores) > 1:
        raise ConfigError("sweeps", "sweeps of one tracking store", [redact_uri(s) for s in stores],
                          "The comparison is logged beside them: copy the runs into one store first.")
    entries = [entry(h) for h in histories]
    sentence, cheapest = cheaper_sentence(entries)
    notes = differences(entries)
    blocks: list[Block] = [f"== {len(entries)} sweeps compared: the best config of each ==", "",
                           comparison_table(entries), "", sentence, *notes, "",
                           "MLflow parent runs: " + ", ".join(f"{e.name} ({e.history.parent_run_id})"
                                                              for e in entries),
                           f"results: {histories[0].ui_command}"]
    return Comparison(entries, sentence, cheapest, notes, blocks)


def compare_sweeps(tracking_uri: str, refs: Sequence[str]) -> Comparison:
    """The comparison of the sweeps ``refs`` names (parent run ids or run names) in the
    store at ``tracking_uri``."""
    if isinstance(refs, str) or not isinstance(refs, (list, tuple)) or len(refs) < 2:
        raise ConfigError("sweeps", "two or more sweeps (parent run ids or run names)", refs)
    repeated = [ref for index, ref in enumerate(refs) if ref in refs[:index]]
    if repeated:
        raise ConfigError("sweeps", "two or more different sweeps", list(refs), f"{repeated[0]} is given twice.")
    return compare_histories([load_sweep(tracking_uri, ref) for ref in refs])


def _date(history: SweepHistory) -> str:
    return datetime.datetime.fromtimestamp(history.started_ms / 1000).strftime("%Y-%m-%d %H:%M")


def comparison_plot(comparison: Comparison, path: str) -> str:
    """Bars of each sweep's best config: $ per 1M (the cheapest marked) beside throughput,
    the machine, device and date of each sweep below. Writes a PNG at ``path``."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    entries = comparison.entries
    unit = entries[0].unit if len({e.unit for e in entries}) == 1 else ""
    fig = Figure(figsize=(11.0, 1.6 + 0.55 * len(entries)), layout="constrained")
    cost_ax, speed_ax = fig.subplots(1, 2, sharey=True)
    positions = list(range(len(entries)))[::-1]  # the first sweep on top
    panels = ((cost_ax, [e.usd_per_1m for e in entries], f"$ per 1M {unit or 'of its unit'} (lower is better)"),
              (speed_ax, [e.figure(e.throughput_metric) for e in entries],
               f"throughput, {unit or 'its unit'}/s (higher is better)"))
    for ax, values, title in panels:
        finite = [v for v in values if math.isfinite(v)]
        for y, value, e in zip(positions, values, entries):
            if math.isfinite(value):
                marked = ax is cost_ax and comparison.cheapest is e
                ax.barh(y, value, color="tab:green" if marked else "tab:blue", height=0.6)
                shown = f" ${value:.4g}" + (" (cheapest)" if marked else "") if ax is cost_ax else f" {value:.4g}"
                ax.text(value, y, shown, va="center", fontsize=8)
            else:
                why = (e.no_cost_reason if ax is cost_ax else "") or "not measured"
                # The reason's first clause: its whole text (how to give a price basis) is the
                # table's, and at full length it ran across the other panel.
                ax.text(0, y, f" n/a: {textwrap.shorten(why.split(' (')[0], 48, placeholder='...')}", va="center",
                        fontsize=8, color="tab:red")
        ax.set_xlim(0, max(finite) * 1.35 if finite else 1)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    ticks = [f"{e.name}\n" + ("" if e.history.instance_type == "unknown" else f"{e.history.instance_type}, ")
             + _price_basis(e.history) for e in entries]
    cost_ax.set_yticks(positions, ticks, fontsize=8)
    fig.suptitle("Best config of each sweep, by its first objective", fontsize=12)
    stamps = [f"{e.name}: {e.history.tags.get('hardware') or e.history.tags.get('host.machine', 'unknown machine')}; "
              f"device {e.best.result.get('device', 'unknown') if e.best else 'none measured'}; "
              f"started {_date(e.history)}" for e in entries]
    footer = "\n".join(stamps + [f"compared {datetime.datetime.now():%Y-%m-%d %H:%M}"])
    fig.text(0.0, -0.01, footer, fontsize=7, color="0.35", ha="left", va="top")
    for text in fig.findobj(Text):
        if "$" in text.get_text():  # "$ per 1M" is no formula
            text.set_parse_math(False)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")
    return path


def write_comparison(comparison: Comparison, out_dir: str) -> list[str]:
    """comparison.md, comparison.html and comparison.png under ``out_dir``; their paths."""
    md, page, png = (os.path.join(out_dir, name) for name in COMPARISON_FILES)
    comparison_plot(comparison, png)
    caption = "$ per 1M and throughput of each sweep's best config"
    with open(md, "w") as out:
        out.write(markdown(comparison.blocks) + f"\n![{caption}](comparison.png)\n")
    with open(page, "w") as out:
        out.write(html(comparison.blocks, [("comparison.png", caption)]))
    return [md, page, png]


def log_comparison(comparison: Comparison) -> str:
    """A new MLflow run in the first sweep's experiment, named "compare <names>", tagged
    kind=comparison with the parent runs compared, the files of ``write_comparison`` its
    artifacts and the sentence its description; returns its run id."""
    first = comparison.entries[0].history
    client = mlflow_client(first.tracking_uri)
    cheapest = comparison.cheapest
    tags = {"kind": "comparison", "compared_runs": ",".join(comparison.parent_run_ids),
            "compared_names": ",".join(comparison.names),
            "cheaper_per_sample": cheapest.name if cheapest else "",
            "mlflow.note.content": "\n\n".join([comparison.sentence, *comparison.notes])}
    run = client.create_run(first.experiment_id, run_name=comparison.run_name, tags=tags)
    try:
        with tempfile.TemporaryDirectory(prefix="accelsweep-compare-") as out_dir:
            for path in write_comparison(comparison, out_dir):
                client.log_artifact(run.info.run_id, path)
    except BaseException:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id
