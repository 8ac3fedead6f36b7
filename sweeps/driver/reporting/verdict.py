"""Does the best config beat the baseline, beyond the noise of the measurements?

A sweep's best trial is the maximum of many noisy figures: on a shared VM one config's
figure moves several-fold with the load, and a repeat of the baseline's own config can be
named "best". So the summary says whether the best's lead over the baseline is larger than
the noise both were measured with (``verdict``: the search's trials on a quiet host), or,
with a confirmation phase (confirm.py), whether the rounds that measured them again side by
side show a gain (``confirmed_verdict``: a 95% interval of the paired log ratio over the
rounds without contention). "Not decided" when the figures cannot tell a gain from none.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.record.trial_record import FAILED, TrialRecord, host_loaded, host_slowdown, ranked
from accelsweep.sweeps.driver.reporting.changes import describe_change, is_relative
from accelsweep.trainables.timing.windows import HOST_LOADED
from accelsweep.trainables.turns import turn_key

__all__ = ["Answer", "EQUAL_WITHIN", "HOST_LOADED", "Judgement", "RoundsJudged", "SITTING_NOISE", "TIE_MARGIN",
           "TURN_FIGURES", "TURN_MISJUDGED", "Verdict", "best_record", "config_key", "confirmed_verdict", "host_slowdown", "judge", "judge_rounds",
           "knobs_changed", "measurements", "paired_log_ratios", "simplest_of_tied", "sweep_answer", "verdict"]


def best_record(records: Iterable[TrialRecord], metric: str, mode: str) -> Optional[TrialRecord]:
    """The measured trial with the best ``metric``: the search's leader (one trial per config)."""
    measured = ranked(records, metric)
    if not measured:
        return None
    pick = max if mode == "max" else min
    return pick(measured, key=lambda r: r.metric(metric))


@dataclass(frozen=True)
class Verdict:
    text: str
    change: float  # the best's lead over the baseline, as a fraction (+0.12: 12% better); NaN if unknown
    noise: float  # the noise bound of that change, as a fraction; NaN if unknown
    beats_baseline: bool  # by more than the noise, measured on an unloaded host
    decided: bool = True  # False: the figures forbid a call ("not decided")
    confirmed: bool = False  # from the confirmation phase's rounds
    subject: str = ""  # the config the verdict is about, as the summary calls it ("trial 7", "the baseline")

    def figures(self) -> dict[str, float]:
        """For the sweep's parent run."""
        return {"verdict_change_pct": self.change * 100, "verdict_noise_pct": self.noise * 100,
                "beats_baseline": float(self.beats_baseline), "verdict_decided": float(self.decided),
                "verdict_confirmed": float(self.confirmed)}


def verdict(baseline: Optional[TrialRecord], best: Optional[TrialRecord], metric: str, mode: str,
            records: Sequence[TrialRecord]) -> Optional[Verdict]:
    """The verdict on ``best`` against ``baseline`` by ``metric`` (the first objective);
    None when either has no measurement of it. The noise bound combines each trial's
    window-to-window spread (``throughput_cv``; a kernel's ``latency_cv``) as
    2 * sqrt(cv_a^2 + cv_b^2): about two standard deviations of the difference of two
    figures, each with its own spread. Not trusted for a verdict: a trial whose host probe
    (``host_probe_s``, a fixed pure-Python loop timed between windows) ran more than
    HOST_LOADED slower than the sweep's median probe (a loaded host), and one every window
    of which was contended (trainables/contention.py: a single-threaded probe misses what a
    two-thread trial loses to one busy neighbour)."""
    if baseline is None or best is None or not baseline.measured(metric):
        return None
    base_value, best_value = baseline.metric(metric), best.metric(metric)
    if base_value == 0:
        return None
    change = (best_value - base_value) / abs(base_value) * (1 if mode == "max" else -1)
    noise = 2 * math.sqrt(baseline.noise ** 2 + best.noise ** 2)
    pair = [baseline] if best is baseline else [baseline, best]
    contended = [r for r in pair if r.contended]
    loaded = [r for r in pair if host_loaded(r, records) and r not in contended]
    spreadless = " and ".join("the baseline" if r is baseline else f"trial {r.number}" for r in pair
                              if not math.isfinite(r.noise))
    noise_text = (f"+-{noise:.1%}" if math.isfinite(noise)
                  else f"unknown (no window-to-window spread for {spreadless}: it takes 2 windows or more)")
    if best is baseline:
        if not any(r is not baseline and r.measured(metric) for r in records):
            # Nothing else was measured (the budget ran out, every other trial failed): no comparison.
            return Verdict("not decided: the baseline is the only config measured (no other trial measured "
                           f"{metric}): nothing to compare it with", 0.0, noise, False, decided=False,
                           subject="the baseline")
        disturbed = [r for r in records if r is not baseline and r.contended and r.measured(metric)]
        if disturbed or baseline.contended:
            which = ", ".join(f"trial {r.number}" for r in disturbed[:5]) + (" and more" if len(disturbed) > 5 else "")
            text = (f"not decided: the baseline measured best, but {which or 'the baseline'} measured while other "
                    "processes took the cores of every window (contended): measure again (--confirm-rounds) "
                    "or on a quiet machine")
            return Verdict(text, 0.0, noise, False, decided=False, subject="the baseline")
        text = f"no config beat the baseline: it measured best itself (its noise: {noise_text})"
        return Verdict(text, 0.0, noise, False, subject="the baseline")
    subject = f"trial {best.number}"
    # A metric near zero (an error) changes by a difference, not by a percentage (changes.py).
    lead = (f"trial {best.number} at {describe_change(base_value, best_value, mode)} over the baseline"
            if is_relative(base_value, best_value) else
            f"trial {best.number} at {describe_change(base_value, best_value, mode)} ({base_value:.4g} to "
            f"{best_value:.4g}) against the baseline")
    if contended:
        which = " and ".join("the baseline" if r is baseline else f"trial {r.number}" for r in contended)
        text = (f"not trusted: other processes took cores from every window of {which} (contended); {lead}, "
                f"noise {noise_text}: measure again (--confirm-rounds) or on a quiet machine")
        return Verdict(text, change, noise, False, decided=False, subject=subject)
    if loaded:
        which = " and ".join("the baseline" if r is baseline else f"trial {r.number}" for r in loaded)
        text = (f"not trusted: {which} ran while the host was loaded (its speed probe "
                f"{max(host_slowdown(r, records) for r in loaded):.0%} slower than the sweep's typical); "
                f"{lead}, noise {noise_text}: measure again on a quiet machine")
        return Verdict(text, change, noise, False, decided=False, subject=subject)
    if not math.isfinite(noise):
        return Verdict(f"{lead}; noise {noise_text}", change, noise, False, decided=False, subject=subject)
    if change > noise:
        return Verdict(f"{lead}: beats it beyond the measured noise of {noise_text}", change, noise, True,
                       subject=subject)
    return Verdict(f"no config beat the baseline by more than the measured noise of {noise_text} "
                   f"(the best, {lead})", change, noise, False, subject=subject)


def simplest_of_tied(better: Sequence[RoundsJudged], leader: RoundsJudged, changed: Mapping[str, Sequence[str]],
                     measurements: Sequence[Mapping[str, tuple[float, bool]]], mode: str) -> RoundsJudged:
    """Of the candidates confirmed better than the baseline, the one to recommend: among
    those the rounds do not separate from the ``leader``, the one changing the fewest knobs
    from the baseline, then the higher gain. Breiman's one-standard-error rule, for
    configs: a knob change must earn its place. Not separated: the leader's lead over the
    candidate, paired round by round (both measured beside each other, neither contended),
    is at most one standard error of that lead; or TIE_MARGIN, where the two differ in a
    knob the turn-taking trial misjudges (TURN_MISJUDGED: the rounds hold the round-to-round
    noise of one turn-taking process per config, not how far that process is from a plain
    loop in fresh processes, and a variant with a loader worker and a compile confirmed
    ahead of a config fresh processes measured faster: docs/budget.md). Why paired, not two
    intervals against the baseline overlapping: the baseline's own noise is in both of
    those, and a leader ahead in every round, by far more than either, overlapped a simpler
    candidate whose rounds spread less (tests/test_confirmation.py has the record). Without
    ``changed`` for every tied candidate, the leader."""
    def tied(one: RoundsJudged) -> bool:
        if one is leader:
            return True
        lead = paired_log_ratios(measurements, one.key, leader.key, mode)
        if len(lead) < 2:
            return True  # never measured beside each other: nothing separates them
        floor = math.log1p(TIE_MARGIN) if _differing(one.key, leader.key, changed) & set(TURN_MISJUDGED) else 0.0
        return statistics.fmean(lead) <= max(statistics.stdev(lead) / math.sqrt(len(lead)), floor)

    tied_ones = [j for j in better if tied(j)]
    if not all(j.key in changed for j in tied_ones):
        return leader
    return min(tied_ones, key=lambda j: (len(changed[j.key]), -j.gain))


def _differing(key: str, other: str, changed: Mapping[str, Sequence[str]]) -> set[str]:
    """The knobs two configs (by config key: their searched values as JSON) set apart; from
    what each changes from the baseline where a key is not JSON."""
    try:
        one, two = json.loads(key), json.loads(other)
    except ValueError:
        return set(changed.get(key, ())) ^ set(changed.get(other, ()))
    if not (isinstance(one, dict) and isinstance(two, dict)):
        return set(changed.get(key, ())) ^ set(changed.get(other, ()))
    return {k for k in set(one) | set(two) if one.get(k) != two.get(k)}


# How far a candidate's lead over another in the confirmation can be from what a plain loop
# in fresh processes finds between them (the peer benchmark's judge): each confirmed gain is
# off the judge's by a root mean square that the rounds' noise explains only in part (the
# turn-taking trial is not the plain loop: a variant with a loader worker or a compile has
# confirmed several percent above where the judge puts it), and a lead is the difference of
# two such gains: sqrt(2) x that rms, over every peer record (benchmarks/results/host_rules.md).
TIE_MARGIN = 0.066
# The knobs behind that: a loader's worker processes and a compile change which processes
# and threads a trial runs, and a trial that waits its turn between windows runs them
# otherwise than a plain loop does. Between configs that differ in neither, the rounds'
# own standard error is the rule: most peer pairs' winners had neither, and their claims
# were off the judge by what their rounds' noise and their sitting explain (benchmarks/results/host_rules.md).
TURN_MISJUDGED = ("num_workers", "torch_compile")


# How far one sitting's gain (configs measured in turns by one process each, within a minute
# or two) is from the gain over many sittings, beyond what its rounds' noise explains: the
# sd of the judge's block means (each block fresh processes, minutes apart) less the part its
# rounds explain, pooled over every peer record's judged configs on this host kind, the
# 2-core AMD EPYC VM (benchmarks/results/host_rules.md). It is the host's level over minutes,
# not the process's (benchmarks/results/sitting_spread.md): more rounds in the same sitting do
# not shrink it, so a confirmation in turns counts it in each claim's interval: without it, the
# intervals of claims whose few rounds happened to agree missed the judge's gain.
SITTING_NOISE = 0.033


# Student's t, two-sided 95%, by degrees of freedom (rounds - 1); 1.96 beyond the table.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# A confirmed interval this narrow around no change is a decision: no config beats the
# baseline by more than this (a few percent is what a window's noise is on a quiet machine).
EQUAL_WITHIN = 0.05


def t95(degrees: int) -> float:
    return _T95[degrees - 1] if degrees <= len(_T95) else 1.96


@dataclass(frozen=True)
class RoundsJudged:
    """One candidate against the baseline over the confirmation's rounds."""

    key: str
    rounds: int  # rounds in which both measured without contention
    gain: float  # exp(mean paired log ratio) - 1, signed so that + is better
    low: float  # the 95% interval of that gain
    high: float
    values: tuple[float, ...]  # the candidate's figures in those rounds
    baseline_values: tuple[float, ...]


def _quiet_pairs(measurements: Sequence[Mapping[str, tuple[float, bool]]], baseline_key: str,
                 key: str) -> list[tuple[float, float]]:
    """(``key``'s figure, ``baseline_key``'s) per round in which both measured and neither
    was contended."""
    pairs = []
    for round_ in measurements:
        if key not in round_ or baseline_key not in round_:
            continue
        (value, contended), (base, base_contended) = round_[key], round_[baseline_key]
        if not (contended or base_contended) and value > 0 and base > 0:
            pairs.append((value, base))
    return pairs


def paired_log_ratios(measurements: Sequence[Mapping[str, tuple[float, bool]]], baseline_key: str, key: str,
                      mode: str) -> list[float]:
    """Per quiet round of both, the log ratio of ``key``'s figure to ``baseline_key``'s,
    signed so that + is better."""
    return _log_ratios(_quiet_pairs(measurements, baseline_key, key), mode)


def _log_ratios(pairs: Sequence[tuple[float, float]], mode: str) -> list[float]:
    sign = 1 if mode == "max" else -1
    return [sign * math.log(value / base) for value, base in pairs]


def judge_rounds(measurements: Sequence[Mapping[str, tuple[float, bool]]], baseline_key: str, key: str,
                 mode: str, sitting_noise: float = 0.0) -> RoundsJudged:
    """``key`` against the baseline: per round (config key -> (figure, contended)), the
    log ratio of the two, over the rounds in which both measured and neither was contended.
    ``sitting_noise``: the sd every round shares because all were measured in one sitting
    (SITTING_NOISE for rounds in turns), added to the interval beside the rounds' own."""
    pairs = _quiet_pairs(measurements, baseline_key, key)
    ratios = _log_ratios(pairs, mode)
    values, base_values = tuple(v for v, _ in pairs), tuple(b for _, b in pairs)
    if len(ratios) < 2:
        nan = float("nan")
        return RoundsJudged(key, len(ratios), nan, nan, nan, values, base_values)
    mean = statistics.fmean(ratios)
    half = math.hypot(t95(len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios)), 1.96 * sitting_noise)
    return RoundsJudged(key, len(ratios), math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half),
                        values, base_values)


def confirmed_verdict(measurements: Sequence[Mapping[str, tuple[float, bool]]], baseline_key: str,
                      names: Mapping[str, str], mode: str,
                      changed: Optional[Mapping[str, Sequence[str]]] = None,
                      sitting_noise: float = 0.0) -> tuple[Verdict, list[RoundsJudged]]:
    """The verdict of the confirmation rounds (``names``: candidate key -> how to call it,
    e.g. "trial 7"), and each candidate's judgement. ``changed``: candidate key -> the knobs
    its config changes from the baseline's; with it, of the candidates confirmed better
    that the rounds do not separate from the leader, the call is the one that changes
    fewest (``simplest_of_tied``). Student's t: few rounds give a wide interval, honestly;
    ``sitting_noise`` (``judge_rounds``) widens it by what one sitting cannot average away,
    and "no config beats the baseline" then needs an interval no wider than that allows."""
    judged = [judge_rounds(measurements, baseline_key, key, mode, sitting_noise) for key in names]
    decidable = [j for j in judged if j.rounds >= 2]
    ran = len(measurements)
    if not decidable:
        quiet = max([j.rounds for j in judged] or [0])
        text = (f"not decided: {quiet} of {ran} confirmation round(s) measured the baseline and a candidate "
                f"without contention (2 are needed): measure again on a quieter machine")
        return Verdict(text, float("nan"), float("nan"), False, decided=False, confirmed=True), judged

    def interval(one: RoundsJudged) -> str:
        return f"95% interval {one.low:+.1%} to {one.high:+.1%}, {one.rounds} interleaved rounds"

    better = [j for j in decidable if j.low > 0]
    if better:  # some candidate's whole interval is a gain: the best-confirmed of those is the call
        leader = max(better, key=lambda j: j.gain)
        best = simplest_of_tied(better, leader, changed or {}, measurements, mode)
        text = f"confirmed: {names[best.key]}'s config beats the baseline by {best.gain:+.1%} ({interval(best)})"
        if best is not leader:
            extra = [k for k in changed[leader.key] if k not in changed[best.key]]
            text += (f"; {names[leader.key]}'s {leader.gain:+.1%} ({interval(leader)}) is not separated from it "
                     f"and changes more knobs ({len(changed[leader.key])} to its {len(changed[best.key])}"
                     f"{': ' + ', '.join(extra) if extra else ''}): the simpler config is the call")
        others = [j for j in decidable if j not in (best, leader) and j.gain > best.gain and j.low <= 0]
        if others:
            text += "; " + "; ".join(f"{names[j.key]}'s {j.gain:+.1%} is not decided ({interval(j)})" for j in others)
        return (Verdict(text, best.gain, (best.high - best.low) / 2, True, decided=True, confirmed=True,
                        subject=names[best.key]), judged)
    best = max(decidable, key=lambda j: j.gain)
    half = (best.high - best.low) / 2
    equal_within = math.hypot(EQUAL_WITHIN, 1.96 * sitting_noise)  # the rounds' allowance beside the sitting's
    if all(j.high < 0 or (j.high - j.low) / 2 <= equal_within for j in decidable):
        bound = "" if best.high < 0 else f" by more than {best.high:+.1%}"
        text = (f"confirmed: no config beats the baseline{bound} (the best candidate, {names[best.key]}: "
                f"{best.gain:+.1%}, {interval(best)})")
        return Verdict(text, best.gain, half, False, decided=True, confirmed=True, subject=names[best.key]), judged
    text = (f"not decided: {names[best.key]}'s config is {best.gain:+.1%} against the baseline, but its "
            f"{interval(best)} spans no change: more rounds (--confirm-rounds) or a quieter machine would decide it")
    return Verdict(text, best.gain, half, False, decided=False, confirmed=True, subject=names[best.key]), judged


TURN_FIGURES = "turn_figures"  # a turn-taking trial's windows: JSON [[figure, contended], ...], a tag of its run
config_key = turn_key  # a config's name in the confirmation (one trial per config)


def measurements(records: Sequence[TrialRecord], metric: str) -> list[dict[str, tuple[float, bool]]]:
    """The confirmation trials per round: config key -> (its figure, contended); a failed
    trial's figure is NaN. A trial that took turns gives a round per window it measured."""
    rounds: dict[int, dict[str, tuple[float, bool]]] = {}
    for record in records:
        if TURN_FIGURES in record.result:  # a trial that took turns: one window per round
            for index, (value, contended) in enumerate(json.loads(record.result[TURN_FIGURES]), start=1):
                rounds.setdefault(index, {})[config_key(record.searched)] = (float(value), bool(contended))
            continue
        round_value = record.metric("confirm_round")
        round_index = int(round_value) if math.isfinite(round_value) else 0
        value = record.metric(metric) if record.status != FAILED else float("nan")
        rounds.setdefault(round_index, {})[config_key(record.searched)] = (value, record.contended)
    return [rounds[index] for index in sorted(rounds)]


@dataclass(frozen=True)
class Judgement:
    """The confirmation's verdict, each candidate's rounds, and what each config is called."""

    verdict: Verdict
    candidates: list[RoundsJudged]
    names: dict[str, str]  # config key -> "trial N" (the search's best trial of that config), "the baseline"
    baseline_key: str
    rounds: int
    trials: dict[str, int] = field(default_factory=dict)  # config key -> N of its "trial N" (baseline's too)

    @property
    def answer_key(self) -> Optional[str]:
        """The config the verdict recommends: the one it confirmed beats the baseline, or
        the baseline's when it decided that none does; None when it decided nothing (then
        the search's leader stands, and is not called confirmed)."""
        if not self.verdict.decided:
            return None
        if not self.verdict.beats_baseline:
            return self.baseline_key
        return next((key for key, name in self.names.items() if name == self.verdict.subject), None)


def judge(search: Sequence[TrialRecord], confirmations: Sequence[TrialRecord], metric: str,
          mode: str) -> Optional[Judgement]:
    """The verdict of the confirmation trials ``confirmations`` (None when there are none),
    read from the records alone: the driver's at the end of a sweep, or MLflow's later."""
    base = next((r for r in confirmations if r.is_baseline), None)
    if base is None:
        return None
    baseline_key = config_key(base.searched)
    names, trials = {}, {}
    searched_baseline = next((r for r in search if r.is_baseline), None)
    if searched_baseline is not None:
        trials[baseline_key] = searched_baseline.number
    for record in confirmations:
        key = config_key(record.searched)
        if key != baseline_key and key not in names:
            same = [r for r in search if config_key(r.searched) == key and r.measured(metric)] or \
                   [r for r in search if config_key(r.searched) == key]
            best = max(same, key=lambda r: r.metric(metric) if mode == "max" else -r.metric(metric), default=None)
            names[key] = f"trial {best.number}" if best else "a config"
            if best is not None:
                trials[key] = best.number
    rounds = measurements(confirmations, metric)
    in_one_sitting = any(TURN_FIGURES in r.result for r in confirmations)  # each config one process, in turns
    verdict, judged = confirmed_verdict(rounds, baseline_key, names, mode, knobs_changed(base, confirmations),
                                        SITTING_NOISE if in_one_sitting else 0.0)
    return Judgement(verdict, judged, {baseline_key: "the baseline", **names}, baseline_key, len(rounds), trials)


@dataclass(frozen=True)
class Answer:
    """The sweep's one answer, which its summary table, utilisation line, parent run's tags
    and ``SweepResult.best`` all name: the confirmation's verdict's config when a
    confirmation ran and judged, else the search's leader. ``leader``: the search's own best
    trial (one trial per config), shown beside it when they differ."""

    best: Optional[TrialRecord]
    leader: Optional[TrialRecord]
    judgement: Optional[Judgement]  # the confirmation's; None when none ran

    @property
    def confirmed(self) -> bool:
        """The answer is the confirmation's pick (not the search's leader by default)."""
        return self.judgement is not None and self.judgement.answer_key is not None and self.best is not None


def sweep_answer(search: Sequence[TrialRecord], confirmations: Sequence[TrialRecord], metric: str,
                 mode: str) -> Answer:
    """The search's leader by ``metric``, and the config the sweep recommends (``Answer``).
    Why not always the leader: the leader is the maximum of one noisy trial per config; the
    confirmation measured the candidates again side by side and may call another (a simpler
    tied config, or the baseline itself), and a summary that names two answers is read wrong."""
    leader = best_record(search, metric, mode)
    judgement = judge(search, confirmations, metric, mode) if confirmations else None
    key = judgement.answer_key if judgement is not None else None
    number = judgement.trials.get(key) if key is not None else None
    chosen = next((r for r in search if r.number == number), None) if number is not None else None
    return Answer(chosen or leader, leader, judgement)


def knobs_changed(baseline: TrialRecord, records: Sequence[TrialRecord]) -> dict[str, tuple[str, ...]]:
    """Config key -> the searched knobs whose value differs from the baseline's, per config
    of ``records`` (what the verdict weighs when the rounds cannot separate two configs)."""
    base = dict(baseline.searched)
    return {config_key(r.searched): tuple(sorted(k for k, v in r.searched.items() if base.get(k) != v))
            for r in records}
