import dataclasses
from dataclasses import dataclass

import pytest

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError, one_of
from accelsweep.trainables.platforms import PLATFORMS, get_platform
from accelsweep.trainables.platforms.base import Detection, Platform, PlatformKnobs
from accelsweep.trainables.platforms.cpu import CpuKnobs
from accelsweep.trainables.platforms.cuda import CudaKnobs
from accelsweep.trainables.platforms.neuron import NeuronKnobs


@pytest.mark.parametrize("changes, field, fragments", [
    ({"precision": "fp16"}, "precision", ["fp32, bf16-autocast, bf16", "'fp16'"]),
    ({"batch_size": 0}, "batch_size", ["integer >= 1", "got 0"]),
    ({"batch_size": -4}, "batch_size", ["got -4"]),
    ({"num_workers": -1}, "num_workers", ["integer >= 0"]),
    ({"model": "vit-huge"}, "model", ["vit-b16", "vit-tiny", "'vit-huge'"]),
    ({"patch_embed": "conv3d"}, "patch_embed", ["conv, linear"]),
    ({"model": "resnet50", "patch_embed": "linear"}, "patch_embed", ["non-ViT"]),
    ({"torch_compile": "openxla"}, "torch_compile", ["none, inductor", "'openxla'"]),
    ({"platform": "tpu9"}, "platform", ["cpu, cuda, xla, neuron", "'tpu9'"]),
    ({"neuron_optlevel": 3}, "neuron_optlevel", ["platform 'cpu'", "got 3"]),
    ({"platform": "neuron", "neuron_optlevel": 4}, "neuron_optlevel", ["1, 2, 3", "got 4"]),
    ({"batches_per_execution": 4}, "batches_per_execution", ["does not apply to cpu"]),
    ({"threads": 4, "cpus_per_worker": 2}, "threads", ["<= cpus_per_worker (2)", "got 4"]),
    ({"window_min_s": -1.0}, "window_min_s", [">= 0"]),
    ({"windows": 0}, "windows", ["got 0"]),
    ({"workers": 2, "placement_strategy": "spread"}, "placement_strategy",
     ["PACK, SPREAD, STRICT_PACK, STRICT_SPREAD", "got 'spread'"]),
])
def test_bad_values_name_field_allowed_values_and_given_value(changes, field, fragments):
    with pytest.raises(ConfigError) as caught:
        TrialConfig.make(**changes)
    assert caught.value.field == field
    message = str(caught.value)
    assert message.startswith(f"{field} must be")
    for fragment in fragments:
        assert fragment in message


def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="one of .*batch_size.*got 'batchsize'"):
        TrialConfig.from_dict({"batchsize": 8})


def test_neuron_rejects_autocast_with_compiler_autocast():
    with pytest.raises(ConfigError, match="neuron_auto_cast .*bf16-autocast.*got 'all'"):
        TrialConfig.make(platform="neuron", precision="bf16-autocast", neuron_auto_cast="all")


def test_neuron_rejects_cast_type_without_auto_cast():
    with pytest.raises(ConfigError, match="'matmult' or 'all'"):
        TrialConfig.make(platform="neuron", neuron_auto_cast_type="fp8_e4m3")


def test_round_trip_through_dict():
    config = TrialConfig.make(batch_size=8, precision="bf16", threads=1)
    assert TrialConfig.from_dict(config.to_dict()) == config
    assert config.replace(batch_size=16).batch_size == 16


@pytest.mark.parametrize("flat", [
    {"platform": "cpu", "batch_size": 8, "threads": 1, "channels_last": True},
    {"platform": "cuda", "accelerator_type": "H100", "channels_last": True},
    {"platform": "xla", "batches_per_execution": 4, "compile_cache": "/tmp/xla-cache"},
    {"platform": "tpu", "batches_per_execution": 2},
    {"platform": "neuron", "precision": "fp32", "batches_per_execution": 10, "compile_cache": "s3://bucket/cache",
     "neuron_model_type": "transformer", "neuron_optlevel": 3, "neuron_auto_cast": "all",
     "neuron_auto_cast_type": "fp8_e4m3", "neuron_target": "trn1"},
])
def test_flat_dict_round_trip_keeps_the_knob_names_of_each_platform(flat):
    config = TrialConfig.from_dict(flat)
    as_dict = config.to_dict()
    # One flat dict: generic fields, exactly the platform's own knobs and the workload's
    # (the image classifier's model and patch_embed), under their flat names.
    assert set(as_dict) == (set(TrialConfig.generic_fields()) | set(get_platform(flat["platform"]).Knobs.names())
                            | {"model", "patch_embed", "attention"})
    assert {key: as_dict[key] for key in flat} == flat
    assert TrialConfig.from_dict(as_dict) == config
    assert TrialConfig.make(**flat) == config
    assert type(config.knobs) is get_platform(flat["platform"]).Knobs


@pytest.mark.parametrize("flat, message", [
    ({"platform": "cpu", "batches_per_execution": 4},
     "batches_per_execution must be 1 on platform 'cpu' (its knobs: allocator, channels_last, numa_bind, threads); "
     "got 4. "
     "batches_per_execution does not apply to cpu: it is a knob of xla, neuron, tpu."),
    ({"platform": "xla", "threads": 2},
     "threads must be None on platform 'xla' (its knobs: batches_per_execution); got 2. "
     "threads does not apply to xla: it is a knob of cpu, neuron-standin-cpu."),
])
def test_a_knob_of_another_platform_is_refused_naming_the_platforms_knobs(flat, message):
    with pytest.raises(ConfigError) as caught:
        TrialConfig.from_dict(flat)
    assert str(caught.value) == message
    assert caught.value.field == next(key for key in flat if key != "platform")


def test_a_knob_of_another_platform_at_its_default_means_unused():
    # As before knobs moved to their platforms: a flat dict naming every platform's knob at
    # its "not used" value (written for several platforms, or by an older version) loads.
    config = TrialConfig.from_dict({"platform": "cuda", "neuron_target": None, "threads": None,
                                    "batches_per_execution": 1, "channels_last": True})
    assert config.knobs == CudaKnobs(channels_last=True)
    assert "neuron_target" not in config.to_dict() and "threads" not in config.to_dict()


def test_changing_the_platform_keeps_no_knob_of_the_old_one():
    cpu = TrialConfig.make(threads=1)
    with pytest.raises(ConfigError, match="threads must be None on platform 'neuron'"):
        cpu.replace(platform="neuron")
    assert TrialConfig.make(platform="neuron").knobs == get_platform("neuron").Knobs()


def test_knobs_of_the_wrong_platform_are_refused_when_built_directly():
    with pytest.raises(ConfigError, match=r"knobs must be a CudaKnobs \(the knobs of platform 'cuda'\); got CpuKnobs"):
        TrialConfig(platform="cuda", knobs=CpuKnobs())
    assert TrialConfig(platform="cpu", knobs=CpuKnobs(threads=1)) == TrialConfig.make(threads=1)


def test_each_knob_checks_its_own_value_in_its_platforms_declaration():
    with pytest.raises(ConfigError, match="threads must be an integer >= 1; got 0"):
        CpuKnobs(threads=0)
    with pytest.raises(ConfigError, match="neuron_optlevel must be one of 1, 2, 3; got 4"):
        NeuronKnobs(neuron_optlevel=4)
    with pytest.raises(ConfigError, match="batches_per_execution must be an integer >= 1; got 0"):
        NeuronKnobs(batches_per_execution=0)  # the XLA knobs it extends check themselves too
    with pytest.raises(ConfigError, match="channels_last must be True or False; got 'yes'"):
        TrialConfig.make(platform="cuda", channels_last="yes")


@dataclass(frozen=True)
class ToyKnobs(PlatformKnobs):
    affinity: str = "compact"

    def __post_init__(self):
        one_of("affinity", self.affinity, ("compact", "scatter"))


class ToyPlatform(Platform):
    name, description, precisions, Knobs = "toy", "a platform added by a test", ("fp32",), ToyKnobs

    def detect(self):
        return Detection(False, "a test's platform")

    def torch_device(self):
        raise AssertionError("never run")

    def sync(self, device):
        raise AssertionError("never run")


def test_the_platforms_declaration_is_what_validates(monkeypatch):
    """TrialConfig knows no platform's knobs: a platform added to the registry brings its
    own, and the flat dict accepts them, checks them there and refuses the others."""
    monkeypatch.setitem(PLATFORMS, "toy", ToyPlatform())
    config = TrialConfig.make(platform="toy", affinity="scatter")
    assert config.knobs == ToyKnobs("scatter") and config.to_dict()["affinity"] == "scatter"
    assert TrialConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="affinity must be one of compact, scatter; got 'spread'"):
        TrialConfig.make(platform="toy", affinity="spread")
    with pytest.raises(ConfigError, match=r"threads must be None on platform 'toy' \(its knobs: affinity\); got 1"):
        TrialConfig.make(platform="toy", threads=1)
    with pytest.raises(ConfigError, match="affinity must be .* on platform 'cpu'.* it is a knob of toy"):
        TrialConfig.make(platform="cpu", affinity="scatter")


def test_every_platform_declares_its_knobs_apart_from_the_generic_fields():
    for platform in PLATFORMS.values():
        knobs = platform.Knobs()  # every knob has a default
        assert issubclass(platform.Knobs, PlatformKnobs) and dataclasses.is_dataclass(knobs)
        assert not set(knobs.names()) & set(TrialConfig.generic_fields()), platform.name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(knobs, knobs.names()[0], None)
