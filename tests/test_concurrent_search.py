"""Proposals made while trials run (issue 31 item 1): the sweep's TPE counts the running
trials (constant liar), so N proposals made at once spread, and the dedup never lets two
running trials share a config."""

from __future__ import annotations


import pytest

KNOBS = {"batch_size": [8, 16, 32, 64], "precision": ["fp32", "bf16-autocast", "bf16"], "threads": [1, 2],
         "patch_embed": ["conv", "linear"]}  # the recorded grid's 48 configs


def _space(trial):
    for name, choices in KNOBS.items():
        trial.suggest_categorical(name, choices)


def _score(config) -> float:
    """One clear best corner (batch 64, bf16, 2 threads, linear), as on the recorded grid."""
    return (config["batch_size"] * (1 + KNOBS["precision"].index(config["precision"])) * config["threads"]
            * (1.2 if config["patch_embed"] == "linear" else 1.0))


def _searcher(sampler, token: str):
    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    return FailureAwareOptunaSearch(_space, metric="score", mode="max", sweep_token=token, sampler=sampler)


def _propose_while_running(searcher, finished: int, running: int) -> list:
    """``finished`` trials proposed one at a time and measured, then ``running``
    proposals made with every one of them still running (N free slots at once)."""
    for number in range(finished):
        config = searcher.suggest(f"done{number}")
        searcher.on_trial_complete(f"done{number}", {"score": _score(config)})
    return [searcher.suggest(f"run{number}") for number in range(running)]


def test_the_sweep_sampler_is_the_constant_liar():
    from accelsweep.sweeps.driver.run.searchers import concurrency_aware_tpe

    assert concurrency_aware_tpe(0, 4)._constant_liar is True  # not left to Optuna's version default


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sixteen_proposals_made_while_all_run_are_sixteen_different_configs(seed):
    """Past TPE's start-up trials, 16 slots free at once: the constant liar has each
    proposal avoid the 15 running before it; every slot gets a config, no two alike."""
    from accelsweep.sweeps.driver.run.searchers import concurrency_aware_tpe, config_key

    searcher = _searcher(concurrency_aware_tpe(seed, 4), f"liar-{seed}")
    proposals = _propose_while_running(searcher, finished=8, running=16)
    assert all(isinstance(p, dict) for p in proposals), proposals  # no slot left waiting
    assert len({config_key(p) for p in proposals}) == 16


def test_without_the_liar_concurrent_proposals_cluster_and_slots_wait():
    """Plain TPE proposes the same best region for every free slot: the dedup keeps two
    running trials from sharing a config, but slots are left empty (None) for it. What the
    liar fixes, measured on the same seeds."""
    import optuna

    from accelsweep.sweeps.driver.run.searchers import config_key

    waiting = 0
    for seed in range(3):
        searcher = _searcher(optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, constant_liar=False),
                             f"plain-{seed}")
        proposals = _propose_while_running(searcher, finished=8, running=16)
        configs = [config_key(p) for p in proposals if isinstance(p, dict)]
        assert len(set(configs)) == len(configs)  # the dedup: never two running trials of one config
        waiting += sum(p is None for p in proposals)
    assert waiting > 0


def test_more_slots_than_configs_every_config_runs_once_and_the_rest_wait():
    """A 4-config space and 6 free slots: 4 distinct proposals, then the slots wait
    (None), never FINISHED (the configs are running, not measured) and never a repeat."""
    from accelsweep.sweeps.driver.run.searchers import concurrency_aware_tpe, config_key, searched_out

    def small(trial):
        trial.suggest_categorical("a", [1, 2])
        trial.suggest_categorical("b", [1, 2])

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    searcher = FailureAwareOptunaSearch(small, metric="score", mode="max", sweep_token="small-slots",
                                        sampler=concurrency_aware_tpe(0, 2))
    proposals = [searcher.suggest(f"t{n}") for n in range(6)]
    configs = [config_key(p) for p in proposals if isinstance(p, dict)]
    assert len(configs) == len(set(configs))
    assert proposals[len(configs):] == [None] * (6 - len(configs))
    assert len(configs) >= 3  # random start-up may repeat a running one up to the retry bound
    assert not searched_out("small-slots")
