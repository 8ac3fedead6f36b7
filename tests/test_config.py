import pytest

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.config import TrialConfig


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
])
def test_bad_values_name_field_allowed_values_and_given_value(changes, field, fragments):
    with pytest.raises(ConfigError) as caught:
        TrialConfig(**changes)
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
        TrialConfig(platform="neuron", precision="bf16-autocast", neuron_auto_cast="all")


def test_neuron_rejects_cast_type_without_auto_cast():
    with pytest.raises(ConfigError, match="'matmult' or 'all'"):
        TrialConfig(platform="neuron", neuron_auto_cast_type="fp8_e4m3")


def test_round_trip_through_dict():
    config = TrialConfig(batch_size=8, precision="bf16", threads=1)
    assert TrialConfig.from_dict(config.to_dict()) == config
    assert config.replace(batch_size=16).batch_size == 16
