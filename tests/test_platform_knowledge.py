"""What the studies start from and search on each platform is the platform's own
(trainables/platforms/, ``Platform.study_*`` and the sizing attributes); models and
datasets are the workloads' (trainables/workloads/). The study scripts only compose: they
compare no platform names, and a platform added to the registry is searched on its own
declared knobs by the main job."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelsweep import plan_sweep
from accelsweep.sweeps import neuron_vit
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.platforms import PLATFORM_NAMES, PLATFORMS, get_platform
from accelsweep.trainables.platforms.base import Detection, Platform, PlatformKnobs, TrainingStudy, platform_knob
from tests.test_examples import PUBLIC_MODULES, accelsweep_imports

ROOT = Path(__file__).resolve().parent.parent
# Beside the public API, a study asks the platform registry (get_platform) and imports its own workload.
PLATFORM_REGISTRY = "accelsweep.trainables.platforms"
# and the advanced submodules docs/own-sweep.md names, as a user's script may.
_OWN_SWEEP = (ROOT / "docs" / "own-sweep.md").read_text()
ADVANCED_MODULES = tuple(re.findall(r"^\| `(accelsweep\.[\w.]+)`", _OWN_SWEEP[_OWN_SWEEP.index("### Advanced"):], re.M))


def assert_study_imports(path: Path, *workload_modules: str) -> None:
    """Every accelsweep name the study ``path`` imports is public (its module's ``__all__``
    names it), the platform registry's ``get_platform``, or from its own workload's module."""
    imports = accelsweep_imports(path)
    assert imports, f"{path.name} imports nothing of accelsweep"
    for module, name in imports:
        if module in workload_modules:
            continue
        if module == PLATFORM_REGISTRY:
            assert name == "get_platform", f"{path.name}: {module}.{name}"
            continue
        assert module in PUBLIC_MODULES + ADVANCED_MODULES, f"{path.name}: {module} is not a public module"
        assert name in importlib.import_module(module).__all__, f"{path.name}: {module}.{name} is not public"


def test_no_study_script_compares_platform_names():
    comparison = re.compile(r"platform (==|!=|in) ")
    found = [f"{path.name}:{number}: {line.strip()}" for path in sorted((ROOT / "sweeps").glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if comparison.search(line)]
    assert not found, found


def test_random_images_are_written_once():
    written = [f"{path.relative_to(ROOT)}: {line.strip()}" for top in ("sweeps", "trainables")
               for path in sorted((ROOT / top).rglob("*.py"))
               for line in path.read_text().splitlines() if re.match(r"class \w*Random", line)]
    assert written == ["trainables/workloads/random_images.py: class RandomImageDataset(Dataset):"]


# ---- a platform's declared knobs -------------------------------------------------------------------
@dataclass(frozen=True)
class FakeKnobs(PlatformKnobs):
    fake_tiles: int = platform_knob(1, searched=(1, 2, 4))  # declared: searched over these
    fake_fast_math: bool = False  # a bool: searched both ways
    fake_queue: str = "default"  # nothing declared: not searched
    fake_trace: bool = platform_knob(False, searched=())  # kept out of the search


class FakePlatform(Platform):
    name, description, precisions, Knobs = "fake-accelerator", "a platform of this test only", ("fp32", "bf16"), \
        FakeKnobs
    autocast_device_type = "cpu"

    def detect(self):
        return Detection(True, "a test's platform")

    def torch_device(self):
        raise AssertionError("never run")

    def sync(self, device):
        raise AssertionError("never run")


def test_declared_knobs_say_what_is_searched():
    assert FakeKnobs.searched() == {"fake_tiles": (1, 2, 4), "fake_fast_math": (False, True)}
    assert PlatformKnobs.searched() == {}
    assert get_platform("xla").Knobs.searched() == {"batches_per_execution": (1, 4, 10)}


class ChoicesSeen:
    """An Optuna trial that records the choices each knob was offered and takes the first."""

    def __init__(self):
        self.offered = {}

    def suggest_categorical(self, name, choices):
        self.offered[name] = tuple(choices)
        return choices[0]


@pytest.mark.parametrize("platform", ["xla", "neuron"])
def test_a_smoke_run_traces_at_most_two_steps_a_graph_and_a_study_the_seeds_ten(platform):
    """A 10-step graph compiles for most of a minute on a CPU (XLA's own compiler): not a
    smoke run's seconds a trial. The full study keeps the seed's MpDeviceLoader value."""
    for smoke, searched in ((True, (1, 2)), (False, (1, 4, 10))):
        trial = ChoicesSeen()
        get_platform(platform).study_space(trial, "fp32", TrainingStudy(smoke=smoke, cpus=2))
        assert trial.offered["batches_per_execution"] == searched


def test_the_main_job_searches_a_new_platforms_declared_knobs(monkeypatch):
    monkeypatch.setitem(PLATFORMS, FakePlatform.name, FakePlatform())
    args = neuron_vit.parser().parse_args(["--dry-run", "--platform", "cpu"])
    args.platform = FakePlatform.name  # registered after the flags' choices were listed
    plan = plan_sweep(neuron_vit.build_sweep(args))
    searched = {name: list(distribution.choices) for name, distribution in plan.space.distributions.items()}
    assert searched["fake_tiles"] == [1, 2, 4] and searched["fake_fast_math"] == [False, True]
    assert "fake_queue" not in searched and "fake_trace" not in searched
    assert searched["precision"] == ["fp32", "bf16"]  # the platform's precisions
    assert plan.config_for({}).workload_knobs.model == "vit-b16"  # the seed's model on an accelerator


# ---- what each platform gives the main job --------------------------------------------------------
class Recorder:
    """An Optuna trial stand-in: the knobs suggested, in order, each taking its index-th choice."""

    def __init__(self, index: int = 0):
        self.index, self.choices = index, {}

    def suggest_categorical(self, name, choices):
        self.choices[name] = list(choices)
        return choices[min(self.index, len(choices) - 1)]


SEARCHED = {  # platform -> its own knobs the main job searches after the seed's four (fp32 drawn first)
    "cpu": ["threads", "channels_last", "torch_compile"],
    "cuda": ["channels_last", "torch_compile"],
    "xla": ["batches_per_execution"],
    "neuron": ["batches_per_execution", "workers", "neuron_model_type", "neuron_optlevel", "neuron_auto_cast"],
    "neuron-standin-cpu": ["workers"],
    "tpu": [],
}


@pytest.mark.parametrize("platform", PLATFORM_NAMES)
def test_each_platform_gives_the_main_job_its_space_and_baseline(platform):
    trial = Recorder(0)
    neuron_vit.make_space(platform, smoke=False, cpus=4, instance_type="trn1.32xlarge")(trial)
    assert list(trial.choices) == ["batch_size", "num_workers", "precision", "patch_embed"] + SEARCHED[platform]
    assert trial.choices["precision"] == list(get_platform(platform).precisions)
    assert trial.choices["batch_size"] == list(get_platform(platform).study_batch_sizes)
    base = neuron_vit.base_config(platform, False, 4, "trn1.32xlarge", 0)
    assert base.cpus_per_worker == (4 if get_platform(platform).trial_owns_cpus else 1)
    assert (base.batch_size, base.precision, base.num_workers) == (16, "fp32", 0)  # the seed's baseline
    smoke = neuron_vit.base_config(platform, True, 4, "trn1.32xlarge", 0)
    assert smoke.workload_knobs.model == "vit-micro" and neuron_vit.batch_sizes(platform, smoke=True) == [8, 16, 32]


def test_the_platforms_sizing_reads_as_the_studies_need_it():
    cpu, cuda, xla, standin = (get_platform(name) for name in ("cpu", "cuda", "xla", "neuron-standin-cpu"))
    assert cpu.sized_for_cpu and not standin.sized_for_cpu and not xla.sized_for_cpu
    assert cpu.trial_cpus(8) == {"cpus_per_worker": 8, "threads": 8} and standin.trial_cpus(8) == {"cpus_per_worker": 1}
    assert xla.trial_cpus(8) == {"cpus_per_worker": 8} and get_platform("tpu").trial_cpus(8) == {"cpus_per_worker": 1}
    assert cuda.training_precision == "bf16-autocast" and cpu.training_precision == "fp32" and cuda.loader_processes
    assert cpu.study_model(TrainingStudy())["model"] == "vit-tiny"
    assert standin.study_model(TrainingStudy())["model"] == "vit-micro"  # placement only: its speed means nothing
    neuron = neuron_vit.base_config("neuron", False, 4, "inf2.xlarge", 0)
    assert (neuron.knobs.neuron_target, neuron.knobs.neuron_optlevel) == ("inf2", 2)
    TrialConfig.from_dict(neuron.to_dict())  # a valid config
    assert all(get_platform(name).host_read_cost for name in PLATFORM_NAMES)
