"""Kernel microbenchmarks on an XLA device, for real: torch-xla's CPU client
(PJRT_DEVICE=CPU), the code path the PyTorch baselines take on a NeuronCore or a TPU.
Runs in the XLA venv (.venv-xla); ./env/test.sh runs it there."""

import dataclasses

import pytest

pytestmark = pytest.mark.xla
pytest.importorskip("torch_xla", reason="torch_xla is not installed here: the XLA lane runs in .venv-xla")

from accelsweep.kernels.giou.reference import giou as giou_reference  # noqa: E402
from accelsweep.kernels.registry import OPS, KernelImpl, get_op  # noqa: E402
from accelsweep.trainables.harness.microbench import KernelConfig, run_microbench  # noqa: E402

SMALL = {"giou": dict(batch=4, boxes=64), "attention": dict(batch=2, heads=2, seq=64, head_dim=16, causal=True,
                                                           soft_cap=5.0)}
XLA_IMPLS = [(op, impl.name) for op in OPS for impl in get_op(op).impls_for("xla")]
QUICK = dict(warmup_calls=2, window_min_calls=5, window_min_s=0.05, windows=2)


def test_the_xla_implementations_are_the_expected_ones():
    assert {("giou", "torch-naive"), ("attention", "naive")} <= set(XLA_IMPLS)


@pytest.mark.parametrize("op, impl", XLA_IMPLS)
def test_xla_kernels_match_the_reference_and_compile_once(op, impl):
    result = run_microbench(KernelConfig.make(op=op, impl=impl, platform="xla", **QUICK, **SMALL[op]))
    assert result["max_abs_error"] <= get_op(op).tolerance["float32"]
    assert result["device"].startswith("xla: CPU")
    assert result["timer"] == "host clock around trace, torch_xla.sync and wait_device_ops"
    assert result["compile_s"] > 0 and result["latency_p50_s"] > 0
    assert result["xla_compiles"] == 0  # the first call compiled the graph; the timed calls reused it


_calls = {"n": 0}


def drifting_giou(boxes1, boxes2):
    """Correct every call, but cut at a point that moves: a new graph per call (until the
    cut comes round again)."""
    _calls["n"] += 1
    keep = boxes1.shape[1] - _calls["n"] % boxes1.shape[1]
    full = giou_reference(boxes1.cpu().numpy(), boxes2.cpu().numpy())  # the check sees the right answer
    import torch

    out = torch.from_numpy(full).to(boxes1.device)
    return torch.cat([out[:, :keep] * 1.0, out[:, keep:]], dim=1)


def test_a_kernel_whose_graph_changes_every_call_shows_its_recompiles(monkeypatch):
    import accelsweep.kernels.giou as giou_op

    drifting = KernelImpl("drifting", f"{__name__}:drifting_giou", "torch", ("xla",), "nothing")
    monkeypatch.setattr(giou_op, "SPEC", dataclasses.replace(
        giou_op.SPEC, implementations=giou_op.SPEC.implementations + (drifting,)))
    result = run_microbench(KernelConfig.make(op="giou", impl="drifting", platform="xla", **QUICK, **SMALL["giou"]))
    assert result["xla_compiles"] >= min(result["calls"], 60)


def test_a_torch_kernel_on_neuron_refuses_the_cpu_client():
    """The kernel path's hardware check (the platform's, shared with training): torch-xla
    on its CPU client is not a NeuronCore, so nothing is timed."""
    from accelsweep.kernels.registry import KernelUnavailable

    config = KernelConfig.make(op="giou", impl="torch-naive", platform="neuron", **QUICK, **SMALL["giou"])
    with pytest.raises(KernelUnavailable, match=r"platform neuron needs torch-xla on NEURON, but its device is CPU "
                                                r"\(PJRT_DEVICE=CPU\): nothing timed"):
        run_microbench(config)
