import pickle

import pytest
from ray import tune

from accelsweep.trainables.errors import ConfigError
from accelsweep.sweeps.driver.define.space import SearchSpace


def branching(trial):
    trial.suggest_categorical("batch_size", [8, 16])
    if trial.suggest_categorical("precision", ["fp32", "bf16"]) == "fp32":
        trial.suggest_categorical("threads", [1, 2])
    return {"num_workers": 0}


def test_define_by_run_knobs_are_found_including_branches():
    space = SearchSpace(branching)
    assert set(space.distributions) == {"batch_size", "precision", "threads"}
    assert space.constants == {"num_workers": 0}
    points = space.sample(20, seed=1)
    assert all(p["num_workers"] == 0 for p in points)
    assert all(("threads" in p) == (p["precision"] == "fp32") for p in points)


def test_tune_domains_are_accepted():
    space = SearchSpace({"batch_size": tune.choice([8, 16]), "learning_rate": tune.loguniform(1e-4, 1e-2)})
    assert set(space.distributions) == {"batch_size", "learning_rate"}
    assert "float in [0.0001, 0.01] (log)" in "\n".join(space.describe())


def test_empty_space_is_refused():
    with pytest.raises(ConfigError, match="search space must be at least one searched knob"):
        SearchSpace({})
    with pytest.raises(ConfigError, match="search space must be at least one searched knob"):
        SearchSpace(lambda trial: {"batch_size": 8})


def test_baseline_must_lie_in_the_space():
    space = SearchSpace(branching)
    assert space.point_for({"batch_size": 8, "precision": "fp32", "threads": 1}) == {
        "batch_size": 8, "precision": "fp32", "threads": 1}
    with pytest.raises(ConfigError, match="baseline batch_size must be one of 8, 16; got 48"):
        space.point_for({"batch_size": 48, "precision": "fp32", "threads": 1})


def test_closure_spaces_survive_plain_pickle():
    """Tune checkpoints its searcher with plain pickle; users write closures."""
    choices = [4, 8]

    def closure(trial):
        trial.suggest_categorical("batch_size", choices)

    restored = pickle.loads(pickle.dumps(SearchSpace(closure).define_by_run))
    assert SearchSpace(restored).distributions.keys() == {"batch_size"}
