"""The confirmation phase: the search's winner measured again against the baseline,
interleaved, before the sweep says which config is better.

A search ranks each config by one trial; on a shared machine one trial can be taken at a bad
moment, and the best of many noisy figures is biased upward by being the best. So when the
search ends, the baseline and the best CANDIDATES configs run again in ``rounds`` rounds, each
in a rotated order (A B C, B C A, C A B: a drift of the machine's speed falls on each config in
turn), under the search's conditions (trainable, config, windows, resources; nothing stopped
early or rejected). The verdict comes from these rounds alone (verdict.confirmed_verdict): each
round pairs a candidate with the baseline measured beside it; a contended round is left out.
Each confirmation trial is an MLflow run under the parent run, tagged ``phase=confirmation``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

from ray.tune import Stopper
from ray.tune.search import Searcher

from accelsweep.sweeps.driver.define.edges import EDGE_MARK
from accelsweep.sweeps.driver.run.callbacks import SweepCallback
from accelsweep.sweeps.driver.run.goal import callback_of
from accelsweep.sweeps.driver.record.history import CONFIRMATION, PHASE_TAG
from accelsweep.sweeps.driver.record.trial_record import NOT_RANKED, TrialRecord, trusted
from accelsweep.sweeps.driver.reporting.verdict import (SITTING_NOISE, TURN_FIGURES, Judgement,
                                                        config_key, judge, knobs_changed, measurements)
from accelsweep.sweeps.driver.reporting.noise import PRIOR_MARGIN, FigureNoise, near_best_margin, typical_speed_factors
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.turns import TurnBaton, drain_steps, turn_window_steps

__all__ = ["CANDIDATES", "CLAIM_ROUNDS", "CONFIRMATION", "CONFIRM_BUDGET_SHARE", "Confirmation",
           "ConfirmationReserve", "Judgement", "NEAR_BEST", "PHASE_TAG", "THIRD_ROUNDS", "TURN_CANDIDATES",
           "at_typical_speed", "best_climb_step", "candidates", "config_key", "confirmation_need_s",
           "fitted", "judge", "knobs_changed", "measurements", "one_candidate", "ranked_candidates",
           "round_orders", "run_confirmation", "search_budget_s", "simplest_near_best", "turn_candidates"]

CANDIDATES = 2  # the search's best configs confirmed against the baseline
# In turns a config costs one window per round, not a trial: one more candidate fits while
# every candidate still gets THIRD_ROUNDS (else the third is dropped). Why a third: one trial
# per config ranks the search's near-best configs by the host's moment, and a third slot
# gives the config the judge finds best another chance to be confirmed (replayed over the
# recorded peer searches: docs/budget.md, which candidates).
TURN_CANDIDATES = 3
# The rounds a claim needs: past them a round takes less off the claim's error than the
# sitting it is measured in leaves in it (verdict.SITTING_NOISE): (ROUND_NOISE /
# SITTING_NOISE)^2, rounded up. ROUND_NOISE: the sd of one round's paired log ratio in turns
# (a candidate's window over the baseline's beside it), the median over the peer benchmark's
# recorded claims, read back from their intervals, on this host kind (2-core AMD EPYC);
# benchmarks/results/host_rules.md derives both, and checks that the two together predict the
# claims' error against the judge.
ROUND_NOISE = 0.055
CLAIM_ROUNDS = math.ceil((ROUND_NOISE / SITTING_NOISE) ** 2)
# With a time budget, the search stops at this share short of what is left of it once Ray
# is up: the rest is the confirmation's (and whatever the search leaves unused). On the main
# job's CPU budget (sweeps/neuron_vit.py) that share holds the start of the baseline and two
# candidates and a few rounds of theirs in turns, and leaves the search about the time it had
# before the budget grew for those rounds (docs/budget.md: the split, and the larger share
# tried for rounds of whole trials). Re-measured per host kind by the peer benchmark's
# checks: benchmarks/results/host_rules.md.
CONFIRM_BUDGET_SHARE = 0.35
# When the search's best configs are slow to measure (large batches on a few cores: long
# windows, a long start), that share leaves two of them fewer than 2 x MIN_ROUNDS rounds and
# the confirmation falls back to one; so the search stops earlier, once what is left is what
# they need (ConfirmationReserve), up to this share of what was left once Ray was up.
MAX_CONFIRM_SHARE = 0.5
# How far below the search's best a config's figure may be and still be confirmed as the
# simplest near it: derived from the run's own noise (reporting/noise.py); this recorded
# margin stands until the run has measured it.
NEAR_BEST = PRIOR_MARGIN
MIN_ROUNDS = 2  # fewer pairs decide nothing (a paired interval needs two)
# A third candidate takes turns while every candidate gets a claim's rounds and the
# 2 x MIN_ROUNDS below which one candidate is confirmed alone.
THIRD_ROUNDS = max(CLAIM_ROUNDS, 2 * MIN_ROUNDS)
MAX_TURN_ROUNDS = 30  # enough pairs for a t interval; more only lengthens the phase


def search_budget_s(time_budget_s: Optional[float], confirm_rounds: int) -> Optional[float]:
    """The search's own time budget: the sweep's, less the confirmation's share of it."""
    if time_budget_s is None or not confirm_rounds:
        return time_budget_s
    return time_budget_s * (1 - CONFIRM_BUDGET_SHARE)


def confirmation_need_s(records: Sequence[TrialRecord], metric: str, mode: str) -> float:
    """The seconds a confirmation in turns of the baseline and the search's best
    CANDIDATES so far needs to keep both candidates (``turn_candidates``: 2 x MIN_ROUNDS
    rounds, and the one ``turn_rounds`` keeps as a margin), their start included; NaN
    before the baseline and a candidate have measured."""
    baseline = next((r for r in records if r.is_baseline and r.measured(metric)), None)
    chosen = candidates(records, metric, mode) if baseline is not None else []
    if not chosen:
        return math.nan
    configs = [baseline, *chosen]
    return (sum(_start_seconds(r, records) for r in configs)
            + (2 * MIN_ROUNDS + 1) * sum(_turn_seconds(r) for r in configs))


class ConfirmationReserve(Stopper):
    """Ends the search once what is left of the sweep's budget (``left_s`` when the search
    started) is what the confirmation of its best configs so far needs
    (``confirmation_need_s``), at most MAX_CONFIRM_SHARE of ``left_s``: before it, the
    search's own budget (CONFIRM_BUDGET_SHARE short of ``left_s``) ends it. Holds only the
    sweep's token (Tune pickles its stoppers); a resumed sweep's, whose callback this
    process never registered, stops nothing."""

    def __init__(self, sweep_token: str, left_s: float, metric: str, mode: str):
        self.sweep_token, self.left_s, self.metric, self.mode = sweep_token, left_s, metric, mode
        self.started = time.time()

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False  # a trial is never cut for its own figure

    def stop_all(self) -> bool:
        callback = callback_of(self.sweep_token)
        if callback is None or callback.reserve_reached:
            return bool(callback and callback.reserve_reached)
        need = self._need_s(list(callback.records.values()))
        if not math.isfinite(need) or need <= self.left_s * CONFIRM_BUDGET_SHARE:
            return False  # the search's own budget leaves the confirmation enough
        need = min(need, self.left_s * MAX_CONFIRM_SHARE)
        if time.time() - self.started < self.left_s - need:
            return False
        callback.reserve_reached = (f"the search stopped {need:.0f} s short of the time budget: what the "
                                    f"confirmation of its best configs needs to measure them {2 * MIN_ROUNDS} times "
                                    "each in turn")
        callback._say(f"[search] {callback.reserve_reached}")
        return True

    def _need_s(self, records: Sequence[TrialRecord]) -> float:
        """``confirmation_need_s``, computed again only when a trial's figure changed: Tune
        asks its stoppers at every poll, and the need ranks every record at the host's
        typical speed."""
        figures = tuple((r.trial_id, r.status, r.metric(self.metric)) for r in records if r.measured(self.metric))
        known = getattr(self, "_need_at", None)  # (figures, need); absent in a resumed sweep's pickle
        if known is None or known[0] != figures:
            known = self._need_at = (figures, confirmation_need_s(records, self.metric, self.mode))
        return known[1]


def candidates(records: Sequence[TrialRecord], metric: str, mode: str, count: int = CANDIDATES) -> list[TrialRecord]:
    """``ranked_candidates``' list alone."""
    return ranked_candidates(records, metric, mode, count)[0]


def ranked_candidates(records: Sequence[TrialRecord], metric: str, mode: str, count: int = CANDIDATES,
                      margin: Optional[float] = None) -> tuple[list[TrialRecord], Optional[TrialRecord]]:
    """(candidates, the simplest config near the best or None). The candidates: the best
    ``count`` configs of the search by ``metric`` other than the baseline's, one
    trial each (its best): trusted figures first, then the rest (a figure from contended
    windows, or from a host loaded past HOST_LOADED, which the console calls not trusted;
    it may be the only one a config has, and scaled to the host's typical speed a loaded
    moment's figure can top every trusted one). Figures are taken at
    the host's typical speed where every trial probed it (``at_typical_speed``). Second
    of them, when it is not the best: the simplest config near the best
    (``simplest_near_best``, within ``margin``; None: the run's own, ``noise.near_best_margin``);
    next, the climb's best step past the space's edge (``best_climb_step``)."""
    baseline = next((r for r in records if r.is_baseline), None)
    base_key = config_key(baseline.searched) if baseline else None
    measured = [r for r in records if r.measured(metric) and r.status not in NOT_RANKED]
    figures = at_typical_speed(measured, metric, mode)
    untrusted = {r.trial_id for r in measured if not trusted(r, records)}
    ordered = sorted(measured, key=lambda r: (r.trial_id in untrusted, -figures[r.trial_id] if mode == "max"
                                              else figures[r.trial_id]))
    chosen: dict[str, TrialRecord] = {}
    for record in ordered:
        key = config_key(record.searched)
        if key != base_key and key not in chosen:
            chosen[key] = record
    ranked = list(chosen.values())
    if margin is None:
        margin, _ = near_best_margin(records, metric)
    simplest = (simplest_near_best(ranked, figures, baseline, mode, margin, untrusted)
                if baseline and count >= 2 else None)
    climbed = best_climb_step(ranked, untrusted) if count >= 2 else None
    # The leader first; then the simplest near it (the tie rule's); then the climb's best
    # step: the last is dropped first when short of time.
    order = [*ranked[:1], *[r for r in (simplest, climbed) if r is not None], *ranked[1:]]
    picked = [r for index, r in enumerate(order) if all(r is not o for o in order[:index])][:count]
    return picked, simplest


def best_climb_step(ranked: Sequence[TrialRecord], untrusted: Collection[str] = ()) -> Optional[TrialRecord]:
    """Of the search's steps past the space's edge (``ranked``: best first), the best with a
    trusted figure (quiet, and not in ``untrusted``: trial ids) that is not the leader; None
    when the search climbed no edge. Why a
    candidate: a step is one trial, measured a minute or more from the config it stepped
    from, and on a plateau of batches one trial per batch moves with the host's regime by
    more than the batches differ (benchmarks/results/budget_history.md), so the search ranks
    them by the host's moment; measured beside the leader in the confirmation's rounds,
    they are compared within seconds, and the verdict calls the better."""
    for record in ranked[1:]:
        if (EDGE_MARK in str(record.result.get("local_step", "")) and not record.contended
                and record.trial_id not in untrusted):
            return record
    return None


def simplest_near_best(ranked: Sequence[TrialRecord], figures: Mapping[str, float], baseline: TrialRecord,
                       mode: str, margin: float = NEAR_BEST, untrusted: Collection[str] = ()) -> Optional[TrialRecord]:
    """Of the trusted configs (quiet, and not in ``untrusted``: trial ids) whose figure is
    within ``margin`` of the best's (``ranked``: best first), the one changing the fewest
    knobs from the baseline (then the better figure):
    the candidate the verdict's tie rule (``verdict.simplest_of_tied``) needs in the
    confirmation to choose it. One trial's figure is not precise enough to rule it out: the
    config a plain loop in fresh processes measures best can search several percent below a
    variant of it with more loader workers, and would then not be confirmed."""
    trusted = [r for r in ranked if not r.contended and r.trial_id not in untrusted]
    if not trusted:
        return None
    best = figures[trusted[0].trial_id]
    if mode == "max":
        near = [r for r in trusted if figures[r.trial_id] >= best * (1 - margin)]
    else:
        near = [r for r in trusted if figures[r.trial_id] <= best * (1 + margin)]
    changed = knobs_changed(baseline, near)
    sign = -1 if mode == "max" else 1
    return min(near, key=lambda r: (len(changed[config_key(r.searched)]), sign * figures[r.trial_id]))


def one_candidate(chosen: Sequence[TrialRecord], simplest: Optional[TrialRecord]) -> TrialRecord:
    """The candidate confirmed when only one fits: the simplest config near the search's
    best (``simplest_near_best``, which ``candidates`` puts second) when it is among the
    first two, else the leader. Why not always the leader: the search cannot separate the
    two (within the near-best margin), and the verdict's tie rule
    (``verdict.simplest_of_tied``) would call the simpler one; confirming the leader alone leaves that rule nothing to choose
    from, and the user pays for knobs (a compile, loader processes) that may buy nothing."""
    return simplest if simplest is not None and simplest in chosen[:2] else chosen[0]


def at_typical_speed(records: Sequence[TrialRecord], metric: str, mode: str) -> dict[str, float]:
    """Each trial's ``metric`` as if the host had run at its typical speed for that trial's
    math: scaled by the median ``speed_probe_gflops`` of the trials that probed the same
    kind (dtype, threads) over the trial's own. On a shared VM the host moves between speed
    regimes for tens of seconds at a time, so the search's best raw figures are partly fast
    moments, and the config the judge finds best can rank well down the raw figures. Raw
    figures where any trial has no probe (a GPU's, a user's trainable, an older record): one
    footing for all or none."""
    factors = typical_speed_factors({r.trial_id: (r.metric("speed_probe_gflops"), r.result.get("speed_probe_kind"))
                                     for r in records})
    if factors is None:
        return {r.trial_id: r.metric(metric) for r in records}
    return {r.trial_id: r.metric(metric) * (factors[r.trial_id] if mode == "max" else 1 / factors[r.trial_id])
            for r in records}


def round_orders(keys: Sequence[str], rounds: int) -> list[list[str]]:
    """Each round's order: the configs rotated by one per round."""
    return [list(keys[r % len(keys):]) + list(keys[:r % len(keys)]) for r in range(rounds)]


@dataclass
class Confirmation:
    """What the confirmation phase measured: its trials, the search trial each config
    stands for, and why it did not run when it did not."""

    rounds_planned: int = 0
    baseline_key: str = ""
    stands_for: dict[str, TrialRecord] = field(default_factory=dict)  # config key -> the search's trial
    records: list[TrialRecord] = field(default_factory=list)  # the confirmation trials, in order
    skipped: str = ""  # why it did not run ('' when it ran)
    seconds: float = 0.0
    # The margin within which a candidate counted as near the search's best, and the run's
    # noise it was derived from (None: not measured yet, the recorded margin stood).
    near_best: float = NEAR_BEST
    noise: Optional[FigureNoise] = None


class ConfirmationCallback(SweepCallback):
    """SweepCallback for the confirmation trials: numbered after the search's, tagged with
    their phase, round and the search trial they repeat; not written to the search's
    Optuna study, not offered to its board."""

    def __init__(self, search: SweepCallback, orders: list[list[str]], stands_for: Mapping[str, TrialRecord],
                 baseline_key: str, time_budget_s: Optional[float] = None):
        super().__init__(search.tracker, search.complete_config, search.resources_of, search.baseline, search.cost,
                         {**search.trial_tags, PHASE_TAG: CONFIRMATION}, sum(len(order) for order in orders),
                         print_line=search.print_line, time_budget_s=time_budget_s, metrics=search.metrics,
                         objective_metrics=[search.measured_by], sweep_token=search.sweep_token)
        self.number_floor = max([0, *(r.number for r in search.records.values())])
        self.rounds = [key for r, order in enumerate(orders) for key in [(r + 1, k) for k in order]]
        self.stands_for = dict(stands_for)
        self.baseline_key = baseline_key
        self.round_count = len(orders)
        self._progress, self.verbose = search._progress, search.verbose
        self.deadline, self.storage_watch = search.deadline, search.storage_watch  # --trial-timeout-s, the disk

    def _record(self, trial) -> TrialRecord:
        record = super()._record(trial)
        index = len(self.records) - 1
        round_index, key = self.rounds[index] if index < len(self.rounds) else (0, config_key(record.searched))
        record.is_baseline = key == self.baseline_key
        record.result["confirm_round"] = round_index
        return record

    def repeats(self, record: TrialRecord, short: bool = True) -> str:
        """Which config ``record`` measures again: "baseline", "trial 7" (short), or "the
        baseline", "trial 7's config"."""
        of = self.stands_for.get(config_key(record.searched))
        if record.is_baseline:
            return "baseline" if short else "the baseline"
        if of is None:
            return "config" if short else "a config"
        return f"trial {of.number}" if short else f"trial {of.number}'s config"

    def round_text(self, record: TrialRecord) -> str:
        return f"round {record.result.get('confirm_round')}"

    def run_name(self, record: TrialRecord) -> str:
        return f"confirm-{record.number:03d} ({self.round_text(record)}, {self.repeats(record)})"

    def run_tags(self, record: TrialRecord) -> dict[str, str]:
        of = self.stands_for.get(config_key(record.searched))
        return {"confirm_round": str(record.result.get("confirm_round")),
                "confirms_trial": str(of.number) if of else ""}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        round_index = self.records[trial.trial_id].result.get("confirm_round")
        super().on_trial_result(iteration, trials, trial, {**result, "confirm_round": round_index}, **info)

    def _record_in_study(self, record: TrialRecord) -> None:
        pass  # the study holds the search's trials: what the searcher learnt from

    def _offer_best(self, record: TrialRecord) -> None:
        pass

    def label(self, record: TrialRecord) -> str:
        return f"[confirm {self.round_text(record)}/{self.round_count}: {self.repeats(record, short=False)}]"

    def progress_line(self, record: TrialRecord) -> str:
        line = super().progress_line(record)
        head = line.split("] ", 1)
        return f"{self.label(record)} {head[1] if len(head) == 2 else line}"


def run_confirmation(plan, search: SweepCallback, trainable_for: Callable[..., Any], storage: str,
                     experiment_dir: str, rounds: int, seconds_left: Optional[float],
                     say: Callable[[str], None]) -> Confirmation:
    """Measure the baseline and the search's best configs again in ``rounds`` interleaved
    rounds, within ``seconds_left`` (None: no limit); fewer rounds when they do not fit.
    Configs that can take turns (``turns_refused``) do: all alive at once, a window each in
    turn; the others run a trial per config per round, one at a time.
    ``trainable_for(turns=None, windows=None, share=1)``: the sweep's trainable as Tune runs
    it, taking turns at the baton named ``turns`` over ``windows`` windows, holding 1/share
    of its CPUs."""
    metric, mode = plan.objectives[0]
    records = list(search.records.values())
    baseline = next((r for r in records if r.is_baseline and r.measured(metric)), None)
    near_best, noise = near_best_margin(records, metric)
    chosen, simplest = ranked_candidates(records, metric, mode, count=TURN_CANDIDATES, margin=near_best)
    confirmation = Confirmation(rounds_planned=rounds, near_best=near_best, noise=noise)
    if noise is not None:
        say(f"near the search's best: within {noise.describe()}")
    if baseline is None or not chosen:
        confirmation.skipped = ("the baseline was not measured" if baseline is None
                                else "no config but the baseline's was measured")
        return confirmation
    refused = turns_refused(plan, [baseline, *chosen], metric)
    if not refused:
        return _run_turns(plan, search, trainable_for, storage, experiment_dir, rounds, seconds_left, say,
                          baseline, chosen, simplest, confirmation)
    chosen, leader = chosen[:CANDIDATES], chosen[0]
    if plan.sweep.verbose:
        say(f"confirmation in rounds of trials, not in turns: {refused}")
    chosen, rounds, confirmation.skipped = fitted(baseline, chosen, records, rounds, seconds_left, simplest)
    if confirmation.skipped:
        return confirmation
    pair_s = _round_seconds([baseline, *chosen], records)
    orders = _planned(confirmation, baseline, chosen, rounds)
    points = [dict(confirmation.stands_for[key].searched) for order in orders for key in order]
    callback = ConfirmationCallback(search, orders, confirmation.stands_for, confirmation.baseline_key,
                                    time_budget_s=seconds_left)
    named = ", ".join(f"trial {r.number}" for r in chosen)
    say(f"confirming: the baseline and {named}{_left_out(leader, chosen, near_best)} measured again in {rounds} "
        f"interleaved rounds ({len(points)} trials, one at a time, about {pair_s * rounds:.0f} s)")
    return _fit(confirmation, trainable_for(), points, callback, storage, experiment_dir, seconds_left,
                concurrency=1, reuse_actors=get_platform(plan.sweep.base.platform).reuses_processes)


def _left_out(leader: TrialRecord, chosen: Sequence[TrialRecord], near_best: float) -> str:
    """Why the search's leader is not confirmed, when it is not ('' when it is)."""
    if leader in chosen:
        return ""
    return (f" (one candidate fits: trial {chosen[0].number}, the simplest config within {near_best:.1%} of the "
            f"search's leader, trial {leader.number}, which changes more knobs)")


def _planned(confirmation: Confirmation, baseline: TrialRecord, chosen: Sequence[TrialRecord],
             rounds: int) -> list[list[str]]:
    """The configs ``confirmation`` stands for (the baseline's first) and their ``rounds``
    rotated orders."""
    confirmation.baseline_key = config_key(baseline.searched)
    confirmation.stands_for = {confirmation.baseline_key: baseline, **{config_key(r.searched): r for r in chosen}}
    confirmation.rounds_planned = rounds
    return round_orders(list(confirmation.stands_for), rounds)


def _fit(confirmation: Confirmation, trainable, points: list[dict], callback, storage: str, experiment_dir: str,
         seconds_left: Optional[float], concurrency: int, reuse_actors: bool) -> Confirmation:
    """The confirmation's trials, ``points`` in their order, as Tune runs them: their
    records and the phase's seconds into ``confirmation``."""
    from ray import tune

    started = time.monotonic()
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=InOrder(points), num_samples=len(points),
                                    max_concurrent_trials=concurrency, time_budget_s=seconds_left,
                                    reuse_actors=reuse_actors),
        run_config=tune.RunConfig(name=os.path.basename(experiment_dir) + "-confirm", storage_path=storage,
                                  callbacks=[callback], verbose=0),
    )
    tuner.fit()
    confirmation.records = sorted(callback.records.values(), key=lambda r: r.number)
    confirmation.seconds = time.monotonic() - started
    return confirmation


def turns_refused(plan, configs: Sequence[TrialRecord], metric: str) -> str:
    """Why ``configs`` cannot take turns ('' when they can): the sweep's trainable must
    measure windows at the baton (``takes_turns``) and report each window's ``metric``, and
    each config must run in one process holding only CPUs, which a waiting trial leaves
    to the one measuring (an accelerator of its own needs no turns)."""
    if not getattr(plan.sweep.trainable, "takes_turns", False):
        return "the sweep's trainable does not measure its windows in turns"
    if plan.metrics.per_window(metric) is None:
        return f"the sweep's trainable declares no per-window figure of {metric}"
    for record in configs:
        try:
            config, resources = plan.config_for(record.searched), plan.resources_of(record.searched)
        except (ValueError, KeyError) as error:
            return f"trial {record.number}'s config: {error}"
        if getattr(config, "workers", 1) != 1:
            return f"trial {record.number}'s config trains on {config.workers} data-parallel workers"
        held = sorted(set(resources) - {"CPU", "memory"})
        if held:
            return f"trial {record.number}'s config holds {', '.join(held)}: it does not share its device"
    return ""


def turn_rounds(configs: Sequence[TrialRecord], records: Sequence[TrialRecord], windows: int, rounds: int,
                seconds_left: Optional[float]) -> int:
    """How many windows each config measures in turn: with no time budget, as many as
    ``rounds`` rounds of whole trials would have (``windows`` each); with one, as many as
    fit after the configs' start (they warm up together, so their start-up times add up),
    less one round (the start is estimated from trials that started alone, so without that
    margin a sweep overruns its budget), at most MAX_TURN_ROUNDS."""
    if seconds_left is None:
        return max(MIN_ROUNDS, rounds * windows)
    start_s = sum(_start_seconds(r, records) for r in configs)
    round_s = sum(_turn_seconds(r) for r in configs)
    if not (math.isfinite(start_s) and math.isfinite(round_s) and round_s > 0):
        return max(MIN_ROUNDS, rounds * windows)
    return max(0, min(MAX_TURN_ROUNDS, int((seconds_left - start_s) // round_s) - 1))


def turn_candidates(baseline: TrialRecord, chosen: Sequence[TrialRecord], simplest: Optional[TrialRecord],
                    records: Sequence[TrialRecord], windows: int, rounds: int,
                    seconds_left: Optional[float]) -> tuple[list[TrialRecord], int]:
    """(the candidates that take turns, their rounds) within ``seconds_left``: a third
    candidate only while the rounds still reach THIRD_ROUNDS (a claim's rounds first); one
    alone (``one_candidate``) only when two would measure fewer than 2 x MIN_ROUNDS."""
    chosen = list(chosen)
    turns = turn_rounds([baseline, *chosen], records, windows, rounds, seconds_left)
    while turns < THIRD_ROUNDS and len(chosen) > CANDIDATES:
        chosen = chosen[:-1]
        turns = turn_rounds([baseline, *chosen], records, windows, rounds, seconds_left)
    while turns < 2 * MIN_ROUNDS and len(chosen) > 1:  # fewer candidates, each measured more often
        chosen = chosen[:-1] if len(chosen) > 2 else [one_candidate(chosen, simplest)]
        turns = turn_rounds([baseline, *chosen], records, windows, rounds, seconds_left)
    return chosen, turns


def _start_seconds(record: TrialRecord, records: Sequence[TrialRecord]) -> float:
    """A config's trial time outside its windows (Ray, setup, warm-up, compile) in the
    search, less the limiter's profiled steps (a trial in turns profiles nothing)."""
    spent = _outside_windows_s(record)
    if math.isfinite(spent) and spent > 0:
        return spent
    return max([o for o in map(_outside_windows_s, records) if math.isfinite(o)], default=float("nan"))


def _outside_windows_s(record: TrialRecord) -> float:
    limiter = record.metric("limit_profile_s")
    return record.wall_s - record.metric("measured_s") - (limiter if math.isfinite(limiter) else 0.0)


def _turn_seconds(record: TrialRecord) -> float:
    """One window of ``record``'s config in turns and the untimed steps before it: whole
    steps of its search trial's median until both of a turn's floors are met (the time
    floor, ``turn_window_steps``); the search's mean window where its floors are not known."""
    step_s = record.metric("step_time_p50_s")
    windows = record.metric("windows_done")
    window_s = record.metric("measured_s") / windows if windows > 0 else float("nan")
    floor_s, floor_steps = record.config.get("window_min_s"), record.config.get("window_min_steps")
    if math.isfinite(step_s) and step_s > 0 and floor_s is not None and floor_steps is not None:
        window_s = max(turn_window_steps(int(floor_steps)), math.ceil(float(floor_s) / step_s)) * step_s
    drain = drain_steps(int(record.config.get("num_workers", 0) or 0)) * step_s
    return window_s + (drain if math.isfinite(drain) else 0.0)


def _run_turns(plan, search: SweepCallback, trainable_for, storage: str, experiment_dir: str, rounds: int,
               seconds_left: Optional[float], say: Callable[[str], None], baseline: TrialRecord,
               chosen: list[TrialRecord], simplest: Optional[TrialRecord], confirmation: Confirmation) -> Confirmation:
    """The confirmation in turns (trainables/turns.py): the baseline and the candidates
    each in a trial of its own, all alive, measuring a window each in rotated rounds."""
    import uuid

    records = list(search.records.values())
    leader = chosen[0]
    windows = int(baseline.config.get("windows", 3) or 3)
    chosen, turns = turn_candidates(baseline, chosen, simplest, records, windows, rounds, seconds_left)
    if turns < MIN_ROUNDS:
        confirmation.skipped = (f"{seconds_left:.0f} s were left of the time budget: too little for the baseline "
                                f"and the best config to start and measure {MIN_ROUNDS} windows each in turn "
                                f"(a longer --time-budget-s makes room)")
        return confirmation
    orders = _planned(confirmation, baseline, chosen, turns)
    keys = list(confirmation.stands_for)
    baton_name = f"accelsweep-turns-{uuid.uuid4().hex[:12]}"
    baton = TurnBaton.start(baton_name, [key for order in orders for key in order])
    points = [dict(confirmation.stands_for[key].searched) for key in keys]
    callback = TurnsCallback(search, keys, confirmation.stands_for, confirmation.baseline_key, turns, baton_name,
                             time_budget_s=seconds_left)
    window_s = baseline.metric("measured_s") / max(1.0, baseline.metric("windows_done"))
    named = ", ".join(f"trial {r.number}" for r in chosen)
    say(f"confirming: the baseline and {named}{_left_out(leader, chosen, confirmation.near_best)} take turns: "
        f"each alive in a trial of its own, one {window_s:.2g} s window at a time, {turns} rotated rounds (the "
        f"host's speed drifts; each round compares them within seconds)")
    try:  # all alive at once, each in a process of its own
        return _fit(confirmation, trainable_for(turns=baton_name, windows=turns, share=len(keys)), points,
                    callback, storage, experiment_dir, seconds_left, concurrency=len(points), reuse_actors=False)
    finally:
        import ray

        ray.kill(baton)


def _with_windows(complete_config: Callable[[Mapping], dict], windows: int, searched: Mapping) -> dict:
    return {**complete_config(searched), "windows": windows}


class TurnsCallback(ConfirmationCallback):
    """SweepCallback for a confirmation in turns: a trial per config, each window of it
    a round (its figures kept as the run's ``turn_figures`` tag, where the report reads
    them), and a trial that ends given up at the baton at once."""

    def __init__(self, search: SweepCallback, keys: Sequence[str], stands_for: Mapping[str, TrialRecord],
                 baseline_key: str, turns: int, baton_name: str, time_budget_s: Optional[float] = None):
        super().__init__(search, [list(keys)], stands_for, baseline_key, time_budget_s=time_budget_s)
        self.complete_config = functools.partial(_with_windows, search.complete_config, turns)
        self.round_count, self.baton_name = turns, baton_name
        self.window_metric = search.metrics.per_window(search.measured_by)
        self.figures: dict[str, list[list]] = {}

    def _record(self, trial) -> TrialRecord:
        record = SweepCallback._record(self, trial)
        record.is_baseline = config_key(record.searched) == self.baseline_key
        record.result.update({"confirm_round": 0, TURN_FIGURES: "[]"})  # a trial that never measured: no round
        return record

    def round_text(self, record: TrialRecord) -> str:
        return "turns"

    def run_tags(self, record: TrialRecord) -> dict[str, str]:
        return {**super().run_tags(record), "confirm_round": "turns"}

    def label(self, record: TrialRecord) -> str:
        done = len(self.figures.get(record.trial_id, []))
        return f"[confirm in turns, {done}/{self.round_count} windows: {self.repeats(record, short=False)}]"

    def on_trial_result(self, iteration, trials, trial, result, **info):
        SweepCallback.on_trial_result(self, iteration, trials, trial, {**result, "confirm_round": 0}, **info)
        record = self.records[trial.trial_id]
        figures = self.figures.setdefault(trial.trial_id, [])
        if not result.get("trial_failed") and self.window_metric in result:
            figures.append([float(result[self.window_metric]), bool(result.get("window_contended"))])
        record.result[TURN_FIGURES] = json.dumps(figures)

    def _leave(self, trial) -> None:
        import ray

        try:
            ray.get_actor(self.baton_name).leave.remote(config_key(dict(trial.config)))
        except ValueError:  # the baton is gone: the phase is over
            pass

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._leave(trial)
        super().on_trial_complete(iteration, trials, trial, **info)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._leave(trial)
        super().on_trial_error(iteration, trials, trial, **info)


class InOrder(Searcher):
    """Tune's searcher for a fixed list of configs, proposed in order, once each."""

    def __init__(self, points: Sequence[Mapping[str, Any]]):
        super().__init__()
        self.points = [dict(point) for point in points]
        self.given = 0

    def suggest(self, trial_id: str):
        if self.given >= len(self.points):
            return Searcher.FINISHED
        self.given += 1
        return dict(self.points[self.given - 1])

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        pass

    def save(self, checkpoint_path: str) -> None:  # Tune saves its searcher with the experiment
        with open(checkpoint_path, "w") as saved:
            json.dump({"points": self.points, "given": self.given}, saved, default=str)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as saved:
            state = json.load(saved)
        self.points, self.given = state["points"], state["given"]


def fitted(baseline: TrialRecord, chosen: Sequence[TrialRecord], records: Sequence[TrialRecord], rounds: int,
           seconds_left: Optional[float], simplest: Optional[TrialRecord] = None) -> tuple[list[TrialRecord], int, str]:
    """(candidates, rounds, why none) within ``seconds_left``: one candidate alone (the
    simpler of the first two: ``one_candidate``) before fewer rounds (two rounds give a t
    interval 3x as wide as three), and fewer rounds before none."""
    def rounds_that_fit(configs: Sequence[TrialRecord]) -> int:
        seconds = _round_seconds([baseline, *configs], records)
        if seconds_left is None or not (math.isfinite(seconds) and seconds > 0):
            return rounds
        return int(seconds_left // seconds)

    chosen = list(chosen)
    if rounds_that_fit(chosen) >= rounds:
        return chosen, rounds, ""
    chosen = [one_candidate(chosen, simplest)]
    fit = rounds_that_fit(chosen)
    if fit < MIN_ROUNDS:
        return chosen, 0, (f"{seconds_left:.0f} s were left of the time budget, and a round of the baseline and the "
                           f"best config takes about {_round_seconds([baseline, *chosen], records):.0f} s: "
                           f"{MIN_ROUNDS} rounds do not fit (a longer --time-budget-s makes room)")
    return chosen, min(rounds, fit), ""


def _round_seconds(configs: Sequence[TrialRecord], records: Sequence[TrialRecord]) -> float:
    """About how long one round takes: each config's trial's wall time in the search (a
    trial stopped early: the longest full trial's)."""
    full = [r.wall_s for r in records if r.status == "finished" and math.isfinite(r.wall_s)]
    longest = max(full) if full else float("nan")
    return sum(r.wall_s if r.status == "finished" and math.isfinite(r.wall_s) else longest for r in configs)
