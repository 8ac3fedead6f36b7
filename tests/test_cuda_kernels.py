"""Every implementation registered for cuda, through the harness, on a CUDA GPU: checked
against the float64 reference and timed with CUDA events. CI has no GPU, so these skip
there with the reason; they ran on an H100 (see the README's "what was verified where").
Optional stacks that are not installed (flash-attn, xFormers, Transformer Engine) skip
with what to install."""

import pytest

from accelsweep.kernels.registry import OPS, KernelUnavailable, get_op
from accelsweep.trainables.microbench import KernelConfig, run_microbench

SHAPES = {"giou": dict(batch=8, boxes=512), "nms": dict(boxes=300), "matmul": dict(m=256, k=256, n=256),
          "attention": dict(batch=2, heads=4, seq=256, head_dim=64)}
CUDA_CASES = [(op, impl.name, dtype) for op in OPS for impl in get_op(op).implementations
              if "cuda" in impl.platforms for dtype in (impl.dtypes or get_op(op).dtypes)
              # the CUDA flash and cuDNN SDPA kernels have no float32 (refused by the config)
              if not (impl.name in ("sdpa-flash", "sdpa-cudnn") and dtype == "float32")]


def _needs_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")


@pytest.mark.gpu
@pytest.mark.parametrize("op, impl, dtype", CUDA_CASES)
def test_every_cuda_implementation_matches_its_reference_on_the_gpu(op, impl, dtype):
    _needs_a_gpu()
    config = KernelConfig.make(op=op, impl=impl, platform="cuda", dtype=dtype, warmup_calls=2,
                               window_min_calls=5, window_min_s=0.0, windows=2, **SHAPES[op])
    try:
        result = run_microbench(config)
    except KernelUnavailable as missing:
        pytest.skip(str(missing))
    assert result["max_abs_error"] <= get_op(op).tolerance[dtype]
    assert result["latency_p50_s"] > 0 and result["interpreted"] == 0
    expected_timer = "cuda events" if get_op(op).impl(impl).framework == "torch" else "host clock after block_until_ready"
    assert result["timer"] == expected_timer
    assert "cuda" in result["device"]  # torch: "cuda: NVIDIA ..." (CudaPlatform.describe_device); JAX: "cuda:0"


@pytest.mark.gpu
def test_cuda_event_times_agree_with_the_host_clock_on_a_gpu_bound_kernel():
    """A 4096^3 float32 matmul (milliseconds of GPU work per call): per-call event times
    must match the host clock over a synchronised batch of the same calls."""
    _needs_a_gpu()
    import time

    import torch

    result = run_microbench(KernelConfig.make(op="matmul", impl="torch-matmul", platform="cuda", m=4096, k=4096,
                                              n=4096, windows=3, window_min_s=0.2))
    a = torch.randint(-4, 5, (4096, 4096), device="cuda").float()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    host_per_call = (time.perf_counter() - start) / 50
    assert result["latency_p50_s"] == pytest.approx(host_per_call, rel=0.05)
    assert result["latency_cv"] <= 0.05
