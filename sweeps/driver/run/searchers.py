"""The Optuna searcher a sweep uses (imported when a sweep runs: it imports Ray Tune).

A module of its own, because Tune pickles the searcher with the experiment state: its
class must be importable by name."""

from __future__ import annotations

import math
import time
from typing import Any, Mapping, Optional, Sequence

from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from accelsweep.sweeps.driver.define.edges import EDGE_MARK, climb_base, edge_step, first_figure_s, largest_values
from accelsweep.sweeps.driver.record.optuna_study import holds
from accelsweep.sweeps.driver.record.resumed_runs import MeasuredRun, ResumeNews, resume_news, tell_resumed
from accelsweep.sweeps.driver.run import fair_share
from accelsweep.sweeps.driver.record.trial_record import NOISE_METRICS, config_key
from accelsweep.sweeps.driver.reporting.noise import PRIOR_MARGIN, typical_speed_factors, window_noise

__all__ = ["FailureAwareOptunaSearch", "MAX_REPEATED_PROPOSALS", "MeasuredRun", "ResumeNews", "config_key",
           "concurrency_aware_tpe", "label_proposal", "local_proposals", "neighbours", "take_reuses", "tell_resumed"]

# Proposals in a row of configs already measured before the space counts as searched
# out: TPE keeps proposing its best region, and a small space runs out of new points.
MAX_REPEATED_PROPOSALS = 20

# A proposal that repeats a config running now is withdrawn and TPE asked again, this
# many times at most per free slot; then the slot waits (Tune asks again later). With the
# constant liar a running config is rarely proposed again, so a few tries are plenty, and
# a space smaller than the slots (every config running) costs a few asks, not a loop.
MAX_RUNNING_REPEATS = 4


def concurrency_aware_tpe(seed: Optional[int], n_startup_trials: int):
    """The sweep's TPE sampler. ``constant_liar``: each trial still running counts, while
    it runs, as a result worse than any measured, so N proposals made while N trials run
    spread over the space instead of all landing on the best region the finished results
    point to (ray-project/ray#46965). Ray's OptunaSearch leaves a proposal's
    Optuna trial RUNNING, its params set, until Tune reports it ended: the liar sees every
    running trial. Said explicitly: Optuna 4 (allowed by pyproject) defaults it to off."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, constant_liar=True)


# Reused proposals waiting for the sweep's callback to record them, and the sweeps whose
# searcher ran out of new configs, by sweep: the searcher and the callback are separate
# objects Tune pickles apart, in one driver process.
_REUSES: dict[str, list[tuple[dict, str]]] = {}
_SEARCHED_OUT: set[str] = set()
# The local search's proposals by sweep: config key -> what it changed from the leader.
_LOCAL: dict[str, dict[str, str]] = {}
_NO_PROBE = (math.nan, None)  # a trial measured by a version that kept no probe: raw values rank


def _finite(value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def searched_out(sweep_token: str) -> bool:
    """Whether the sweep's searcher ended the search: its proposals kept repeating
    measured configs (a grid used up)."""
    return sweep_token in _SEARCHED_OUT


def label_proposal(sweep_token: str, config: Mapping[str, Any], label: str) -> None:
    """Name a config the sweep proposes first for a reason of its own (the platform's first
    guess): its trial's progress line and MLflow tag say ``label`` as a local step's say its step."""
    _LOCAL.setdefault(sweep_token, {})[config_key(config)] = label


def local_proposals(sweep_token: str) -> dict[str, str]:
    """The sweep's proposals that were one step from the leader (config key -> the step,
    e.g. "batch_size 32 -> 64 from trial 9's config")."""
    return _LOCAL.get(sweep_token, {})


def neighbours(params: Mapping[str, Any], distributions: Mapping[str, Any]) -> list[tuple[dict, str]]:
    """The configs one step from ``params``: each categorical knob moved to the choice
    before or after its own in the space's list (batch size x2 and /2 in a list of
    powers of two, loader workers +-1, the precision beside it, a flag flipped), in the
    space's order of knobs, the step up first; each with what it changed."""
    found = []
    for name, distribution in distributions.items():
        if not isinstance(distribution, CategoricalDistribution) or name not in params:
            continue
        choices = list(distribution.choices)
        if params[name] not in choices:
            continue
        index = choices.index(params[name])
        for other in (index + 1, index - 1):
            if 0 <= other < len(choices):
                found.append(({**params, name: choices[other]}, f"{name} {params[name]} -> {choices[other]}"))
    return found


def take_reuses(sweep_token: str) -> list[tuple[dict, str]]:
    """The proposals the searcher answered from an earlier trial since the last call:
    (the proposed config, the trial id whose result it reused)."""
    return _REUSES.pop(sweep_token, [])


class FailureAwareOptunaSearch(OptunaSearch):
    """Optuna through Tune, with two changes.

    A trial that reported its own failure (trainables/loop/failures.py run_isolated) is a failed
    Optuna trial: not a pruned one, and not a NaN value Optuna refuses. TPE then samples
    away from it.

    A proposal identical to a config this sweep has already measured is not run again
    (unless ``repeats``): Optuna is told that trial's result as the proposal's, and asked
    again. TPE re-proposes its best points (the baseline among them) as a matter of
    course; a second run of one config is noise, not information, and could be named
    "best" with every knob unchanged. ``sweep_token`` names where the reuses are
    left for the sweep's callback (``take_reuses``).

    On ``--resume`` (``ResumeNews``, before its first proposal) it learns the results of
    the trials a killed driver measured after Tune's last save, so none is measured again
    and each counts toward ``budget`` (the sweep's num_samples), and it proposes first the
    configs of the trials the kill cut off, which then run again in their own MLflow runs.

    Its last ``local_search`` proposals (of ``budget``) are a local search: each is a
    config one step from the best measured so far (``neighbours``) that no trial has
    measured, so the search ends by checking the leader's surroundings, where TPE's
    sampling leaves gaps (a sweep can miss the config one batch size above its winner).
    With a time budget the local search also begins at ``local_after`` (a time.time()
    moment: the search's last third), whichever comes first: a budget of time
    ends a search before its last proposals when trials compile for tens of seconds.
    With no such config left, TPE proposes as before.

    ``edges`` (``Platform.ordered_knobs``: knob -> (how to step out, how far)): while the
    best measured config sits on the largest value of an ordered knob, its next proposal is
    that config one step past the space's edge (define/edges.py), again while the step
    leads or is within the run's near-best margin of the leader and can measure a window
    before ``ends_at``, ``edge_steps`` at most (None: no limit). Such a config is outside the
    space's distributions: it runs as a trial of the sweep (in its budget, its result known
    here), not as an Optuna trial."""

    def __init__(self, *args, repeats: bool = False, sweep_token: str = "", budget: Optional[int] = None,
                 local_search: int = 0, local_after: Optional[float] = None, prior_trials: Sequence = (),
                 edges: Optional[Mapping[str, tuple[str, Optional[int]]]] = None, edge_steps: Optional[int] = None,
                 ends_at: Optional[float] = None, **kwargs):
        super().__init__(*args, **kwargs)
        # An earlier sweep's results on the same hardware, workload and versions (warm_start.py):
        # completed trials of the study, so TPE models from them. Not this sweep's outcomes:
        # a proposal of one of their configs runs here (the dedup knows only this sweep's).
        for trial in prior_trials:
            self._ot_study.add_trial(trial)
        self.repeats, self.sweep_token, self.budget = repeats, sweep_token, budget
        self.local_search, self.local_after = local_search, local_after
        self.ends_at = ends_at  # a time.time() moment: the search's time budget ends (None: no budget)
        self._proposed: dict[str, str] = {}  # trial id -> config key
        self._outcomes: dict[str, tuple[str, Optional[Any]]] = {}  # config key -> (trial id, value; None: failed)
        self.reused = 0
        self._returned = 0  # configs given to Tune: its count of trials created (SearchGenerator)
        # Trials a killed driver measured after Tune's last save (trial id -> config key):
        # each took one of the sweep's proposals that Tune's saved count lacks.
        self._recovered: dict[str, str] = {}
        # Their configs, enqueued: the proposal of each is answered with its result (config
        # key -> [(trial id, value)]), not run.
        self._answers: dict[str, list[tuple[str, Optional[Any]]]] = {}
        self._edge_state(edges, edge_steps)

    def _edge_state(self, edges: Optional[Mapping[str, tuple[str, Optional[int]]]] = None,
                    edge_steps: Optional[int] = None) -> None:
        self.edges, self.edge_steps = dict(edges or {}), edge_steps
        self._given: dict[str, dict] = {}  # trial id -> the config given to Tune
        # (config, value, its host speed probe) of each trial measured, edge steps too
        self._measured: list[tuple[dict, float, tuple[float, Optional[str]]]] = []
        self._memory: dict[str, tuple[float, float, float]] = {}  # config key -> (peak, workload, capacity) MB
        self._first_figure_s: dict[str, tuple[float, float]] = {}  # config key -> (setup, warm-up + a window) s
        # config key -> (window cv, windows, host probe s) of its trial: the run's near-best margin
        self._figure_noise: dict[str, tuple[float, float, float]] = {}
        self._edge_trials: dict[str, dict] = {}  # trial id -> a config past the space's edge
        self._edge_again: list[dict] = []  # such configs a resumed sweep runs again (their trial was cut off)

    def _since_resume_was_added(self) -> None:
        """What a searcher saved by a version before these counts lacks."""
        for name, empty in (("budget", None), ("_returned", len(getattr(self, "_ot_trials", ()))),
                            ("_recovered", {}), ("_answers", {}), ("local_search", 0),
                            ("local_after", None), ("ends_at", None), ("_first_figure_s", {})):
            self.__dict__.setdefault(name, empty)
        if "edges" not in self.__dict__:
            self._edge_state()
        self.__dict__.setdefault("_edge_again", [])
        self.__dict__.setdefault("_figure_noise", {})
        self._measured = [entry if len(entry) == 3 else (*entry, _NO_PROBE) for entry in self._measured]

    def __setstate__(self, state: dict) -> None:  # unpickled from Tune's tuner.pkl
        self.__dict__.update(state)
        self._since_resume_was_added()

    def suggest(self, trial_id: str) -> Optional[dict]:
        self._learn(resume_news(self.sweep_token))
        if self.budget is not None and self._returned + len(self._recovered) >= self.budget:
            return Searcher.FINISHED  # the recovered trials took the proposals left
        # On a cluster other sweeps share, a trial is created only with a seat (fair_share.py):
        # None until then, and Tune asks again.
        gate = fair_share.gate_of(self.sweep_token)
        if gate is not None and not gate.may_create(trial_id):
            return None
        config = self._suggest(trial_id)
        if gate is not None and not isinstance(config, dict):
            gate.release(trial_id)  # no trial after all: the seat back
        if isinstance(config, dict):
            self._given[trial_id] = dict(config)
        return config

    def _suggest(self, trial_id: str) -> Optional[dict]:
        edge = self._step_past_edge()
        if edge is not None:
            config, step = edge
            self._proposed[trial_id] = config_key(config)
            self._edge_trials[trial_id] = config
            _LOCAL.setdefault(self.sweep_token, {})[config_key(config)] = step
            return self._publish({}, config)
        self._step_from_leader()
        # Repeats answered on the way to this trial's config: recorded (once per config)
        # when it comes; repeats that end the search (its space used up) are not news.
        answered: dict[str, tuple[dict, str]] = {}
        running_repeats = 0
        # Room for MAX_REPEATED_PROPOSALS repeats of measured configs besides the running ones.
        for _ in range(MAX_REPEATED_PROPOSALS + MAX_RUNNING_REPEATS):
            config = super().suggest(trial_id)
            if config is None or config == Searcher.FINISHED:
                return self._publish(answered, config)
            key = config_key(config)
            if self._answers.get(key):
                # A recovered trial's config: Optuna gets its result as this proposal's, once.
                _, value = self._answers[key].pop(0)
                if not self._tell(self._ot_trials.pop(trial_id), value):
                    break
                continue
            if self.repeats:
                return self._publish(answered, config)
            measured = self._outcomes.get(key)
            running = key in self._running_keys()
            if measured is None and not running:
                self._proposed[trial_id] = key
                return self._publish(answered, config)
            # Answer this proposal from what is known, and ask again for the same Tune trial.
            ot_trial = self._ot_trials.pop(trial_id)
            if measured is None:
                # The same config runs now: its result is not known yet. Withdrawn (a FAIL,
                # which TPE ignores) and TPE asked again: with several trials running, the
                # next proposal is usually new. After a few, the slot waits: Tune asks
                # again later (None: no proposal for now), by then it may be measured.
                self._tell(ot_trial, None)
                running_repeats += 1
                if running_repeats >= MAX_RUNNING_REPEATS:
                    return self._publish(answered, None)
                continue
            original, value = measured
            if not self._tell(ot_trial, value):
                break
            self.reused += 1
            answered[key] = (dict(config), original)
        _SEARCHED_OUT.add(self.sweep_token)
        return Searcher.FINISHED  # searched out: every recent proposal was measured already

    def _publish(self, answered: Mapping[str, tuple[dict, str]], config: Any) -> Any:
        _REUSES.setdefault(self.sweep_token, []).extend(answered.values())
        if isinstance(config, dict):
            self._returned += 1
        return config

    def _learn(self, news: Optional[ResumeNews]) -> None:
        """A resumed sweep's news (idempotent: a sweep killed again before Tune saved this
        searcher hands the same news to the next resume)."""
        if news is None:
            return
        if news.tune_trials is not None:
            # This searcher was saved a moment apart from Tune's trials (a kill in the midst of
            # Tune's save): Tune's trials count, and a proposal no trial has is withdrawn.
            self._returned = len(news.tune_trials)
            for trial_id in [t for t in self._ot_trials
                             if t not in news.tune_trials and t not in self._completed_trials]:
                self._tell(self._ot_trials.pop(trial_id), None)
                self._proposed.pop(trial_id, None)
            for trial_id in [t for t in self._edge_trials
                             if t not in news.tune_trials and t not in self._completed_trials]:
                self._edge_trials.pop(trial_id)  # a step no trial has: proposed again if a resume asks
                self._proposed.pop(trial_id, None)
        for run in news.measured:
            if run.trial_id in self._completed_trials or run.trial_id in self._recovered:
                continue  # known already
            if run.trial_id in self._edge_trials:  # a step past the edge Tune saved in flight: no Optuna trial
                self._given.setdefault(run.trial_id, dict(run.config))
                self.on_trial_complete(run.trial_id, result=run.result, error=run.failed)
                continue
            if not self._in_space(run.config):
                # A step past the edge proposed after the save: its result is known here, no
                # Optuna proposal can carry it (its value is not among the space's choices).
                value = None if run.failed else self._value_of(run.result)
                self._recovered[run.trial_id] = config_key(run.config)
                self._outcomes.setdefault(config_key(run.config), (run.trial_id, value))
                if not run.failed:
                    self._given[run.trial_id] = dict(run.config)
                    self._remember(run.trial_id, run.result)
                continue
            if run.trial_id in self._ot_trials:
                # In flight when Tune saved it, ended before the kill: Tune's saved state now
                # says it ended (resumed_runs.py), and Tune will not tell this searcher.
                self.on_trial_complete(run.trial_id, result=run.result, error=run.failed)
                continue
            # Proposed and measured after the save: unknown to this searcher's state.
            key = config_key(run.config)
            value = None if run.failed else self._value_of(run.result)
            self._recovered[run.trial_id] = key
            self._outcomes.setdefault(key, (run.trial_id, value))
            self._answers.setdefault(key, []).append((run.trial_id, value))
            self._enqueue(run.config)
        for config in news.again:
            self._enqueue(config)

    def _enqueue(self, config: dict) -> None:
        """Have ``config`` proposed before anything new, unless it waits in the queue already
        (a sweep's ``points`` not yet proposed when Tune saved this searcher). A config past
        the space's edge waits in a queue of its own (``_step_past_edge`` proposes it)."""
        if not self._in_space(config):
            if config_key(config) not in {config_key(c) for c in self._edge_again}:
                self._edge_again.append(dict(config))
            return
        waiting = self._ot_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if not any(config_key(t.system_attrs.get("fixed_params") or {}) == config_key(config) for t in waiting):
            self._ot_study.enqueue_trial(config)

    def _step_from_leader(self) -> None:
        """In the local search's share of the budget, enqueue the first unmeasured config
        one step from the best trial so far (nothing when the queue holds a proposal
        already: a sweep's points, a resumed sweep's configs)."""
        if not self.local_search or self.budget is None or isinstance(self.metric, list):
            return
        late = self.local_after is not None and time.time() >= self.local_after
        if not late and self._returned + len(self._recovered) < self.budget - self.local_search:
            return
        trials = self._ot_study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return
        measured = [t for t in trials if t.state == TrialState.COMPLETE and _finite(t.value)]
        if not measured:
            return
        leader = measured[self._leader_of([(config_key(t.params), t.value) for t in measured])]
        taken = {config_key(t.params) for t in trials} | set(self._outcomes)
        taken |= {config_key(t.system_attrs.get("fixed_params") or {}) for t in trials}
        for config, step in neighbours(leader.params, leader.distributions):
            if config_key(config) not in taken:
                self._ot_study.enqueue_trial(config)
                _LOCAL.setdefault(self.sweep_token, {})[config_key(config)] = step
                return

    def _leader_of(self, figures: Sequence[tuple[str, float]], typical: bool = True) -> int:
        """Which of ``figures`` ((config key, value), one per measured trial) leads: by value
        at the host's typical speed (noise.typical_speed_factors over every measured trial's
        probe), as the confirmation ranks its candidates, so the local search and the edge
        steps go on from the config the confirmation would call best, not from one measured
        in a fast moment of a drifting host. Raw values when any of them has no probe (a
        warm start's trials, a GPU's). ``typical`` False: ``figures`` are at that speed already."""
        factors = {}
        if typical:  # else the figures are at that speed already: no probe's factor is read
            factors = typical_speed_factors({config_key(c): probe for c, _, probe in self._measured}) or {}
        if not all(key in factors for key, _ in figures):
            factors = {}
        sign = 1 if self.mode == "max" else -1
        return max(range(len(figures)),
                   key=lambda i: sign * figures[i][1] * factors.get(figures[i][0], 1.0) ** sign)

    def _running_keys(self) -> set[str]:
        """The config keys of the proposals Tune runs now."""
        return {k for t, k in self._proposed.items() if t not in self._completed_trials}

    def _distributions(self) -> dict[str, Any]:
        distributions: dict[str, Any] = {}
        for trial in self._ot_study.get_trials(deepcopy=False):
            distributions.update(trial.distributions)
        return distributions

    def _in_space(self, config: Mapping[str, Any]) -> bool:
        """Whether every knob of ``config`` the space has a distribution for holds its value."""
        distributions = self._distributions()
        return all(holds(distributions[k], v) for k, v in config.items() if k in distributions)

    def _step_past_edge(self) -> Optional[tuple[dict, str]]:
        """A resumed sweep's step past the edge first (its trial was cut off); else the
        leader's config one step past the space's edge, when it sits on one and that step is
        neither measured nor running (define/edges.py), and no queued proposal waits (a
        sweep's points, its first guess, a resume's configs go first). Else None."""
        if self._edge_again:
            config = self._edge_again.pop(0)
            return config, self._edge_label(config)
        if not self.edges or isinstance(self.metric, list) or not self._measured:
            return None
        if self.edge_steps is not None and len(self._edge_trials) >= self.edge_steps:
            return None  # the rest of the budget is the search's
        trials = self._ot_study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return None
        figures = self._at_typical_speed()
        leader = figures[self._leader_of([(config_key(c), f) for c, f in figures], typical=False)][0]
        taken = set(self._outcomes) | self._running_keys() | {config_key(t.params) for t in trials}
        largest = largest_values(self._distributions(), self.edges)
        for knob, rule in self.edges.items():
            base = climb_base(leader, knob, figures, self._near_best_margin(), self.mode)
            left = self.ends_at - time.time() if self.ends_at is not None else None
            step = edge_step(base, self._memory.get(config_key(base)), {knob: rule}, largest, taken,
                             self._first_figure_s.get(config_key(base)), left)
            if step is not None:
                return step
        return None

    def _at_typical_speed(self) -> list[tuple[dict, float]]:
        """(config, figure) of each measured trial, at the host's typical speed where every
        trial probed it (``_leader_of``), else raw."""
        factors = typical_speed_factors({config_key(c): probe for c, _, probe in self._measured}) or {}
        sign = 1 if self.mode == "max" else -1
        return [(c, v * factors.get(config_key(c), 1.0) ** sign) for c, v, _ in self._measured]

    def _near_best_margin(self) -> float:
        """The run's near-best margin (reporting/noise.py) over the trials measured so far;
        PRIOR_MARGIN while too few measured it."""
        noise = window_noise(*zip(*self._figure_noise.values())) if self._figure_noise else None
        return noise.margin if noise is not None else PRIOR_MARGIN

    def _edge_label(self, config: Mapping[str, Any]) -> str:
        return _LOCAL.get(self.sweep_token, {}).get(config_key(config), f"run again {EDGE_MARK}")

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self._edge_trials:
            return  # not an Optuna trial: nothing to report to it
        super().on_trial_result(trial_id, result)

    def _value_of(self, result: Mapping[str, Any]) -> Any:
        if isinstance(self.metric, list):
            return [result.get(m) for m in self.metric]
        return result.get(self.metric)

    def _tell(self, ot_trial, value) -> bool:
        """Tell Optuna a proposal's value (None or not finite: failed). False when the
        sampler is done: a grid used up refuses any more (GridSampler stops the study)."""
        try:
            if _finite(value):
                self._ot_study.tell(ot_trial, value)
            else:
                self._ot_study.tell(ot_trial, state=TrialState.FAIL)
        except RuntimeError:
            return False
        return True

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        # The trials in flight when Tune saved this searcher are run again by Tune under the
        # same ids (or marked ended: resumed_runs.py), so their proposals stay known: a result
        # of theirs is remembered, and their config is not proposed beside them.
        self._since_resume_was_added()

    def on_trial_complete(self, trial_id, result=None, error=False):
        gate = fair_share.gate_of(self.sweep_token)
        if gate is not None:  # Tune ends the trial's actor now: its seat is free
            gate.release(trial_id)
        if result and result.get("trial_failed"):
            result, error = None, True
        self._remember(trial_id, result if not error else None)
        if trial_id in self._edge_trials:  # a step past the edge: known here, not to Optuna
            key = config_key(self._edge_trials[trial_id])
            self._outcomes.setdefault(key, (trial_id, self._value_of(result) if result and not error else None))
            self._completed_trials.add(trial_id)
            return
        if trial_id not in self._ot_trials:
            return  # a trial Tune saved a moment after this searcher (a kill in the midst of a save)
        key = self._proposed.get(trial_id)
        if key is not None and trial_id not in self._completed_trials:
            value = self._value_of(result) if result and not error else None
            self._outcomes.setdefault(key, (trial_id, value))
        super().on_trial_complete(trial_id, result=result, error=error)

    def _remember(self, trial_id: str, result: Optional[Mapping[str, Any]]) -> None:
        """A measured trial's config and value, and its memory figures (for the edge steps)."""
        config = self._given.get(trial_id)
        if config is None or not result or isinstance(self.metric, list):
            return
        value = self._value_of(result)
        if _finite(value):
            probe = (float(result.get("speed_probe_gflops", math.nan)), result.get("speed_probe_kind"))
            self._measured.append((config, float(value), probe))
        memory = tuple(float(result.get(name, math.nan)) for name in
                       ("peak_memory_mb", "workload_memory_mb", "memory_capacity_mb"))
        self._memory[config_key(config)] = memory
        self._first_figure_s[config_key(config)] = first_figure_s(result)
        windows = float(result.get("windows_done", math.nan))
        if 0 < int(result.get("contended_windows", 0) or 0) >= windows:
            return  # a neighbour's CPU is not the host's noise (noise.figure_noise leaves such trials out too)
        cv = next((float(result[name]) for name in NOISE_METRICS if _finite(result.get(name))), math.nan)
        self._figure_noise[config_key(config)] = (cv, windows, float(result.get("host_probe_s", math.nan)))
