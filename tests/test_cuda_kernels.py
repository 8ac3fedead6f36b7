"""Every implementation registered for cuda, through the harness, on a CUDA GPU: checked
against the float64 reference and timed by the device's work (CUDA events around held
batches; JAX: batches of async calls timed by the GPU's own trace). CI has no GPU, so these
skip there with the reason; they ran on lent H100s (docs/gpu.md): the reference checks on
2026-11-22, the held-batch timer and its cv target on 2026-11-26 (every torch
implementation within 0.6%; JAX's, timed by the trace, within 0.22%: on the host clock
three missed 2%). Optional
stacks that are not installed (flash-attn, xFormers, Transformer Engine) skip with what
to install."""

import pytest

from accelsweep.kernels.registry import OPS, KernelUnavailable, get_op
from accelsweep.trainables.timing.device import HeldWindow, TracedWindow
from accelsweep.trainables.harness.microbench import KernelConfig, run_microbench
from accelsweep.trainables.platforms.cuda import CALL_SYNCHRONISES_TIMER

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
    if get_op(op).impl(impl).framework == "torch":
        assert result["timer"] in (HeldWindow.timer, CALL_SYNCHRONISES_TIMER)
    else:
        assert result["timer"] == TracedWindow.timer, result["timer"]  # the device's record, not the host
    if result["timer"] != CALL_SYNCHRONISES_TIMER:
        assert result["host_enqueue_s"] > 0 and result["launch_bound"] in (0.0, 1.0)
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


def _jax_gpu():
    jax = pytest.importorskip("jax")
    if not any(device.platform == "gpu" for device in jax.devices()):
        pytest.skip(f"needs JAX on a GPU (devices: {jax.devices()})")
    return jax


@pytest.mark.gpu
def test_jax_device_trace_times_agree_with_the_host_clock_on_a_gpu_bound_call():
    """A 4096^3 float32 JAX matmul (GPU-bound), 50 calls queued back to back: the trace's
    extent (first kernel's start to last one's end) must match the host clock over the
    synchronised batch (a record off the host's clock, or one missing calls, would not),
    and its busy time (the figure the harness reports) must be most of that extent, never
    more (a kernel counted twice would be). On a lent H100 the busy time was 6% under the
    host clock (313 vs 333 us): the gap between JAX executions is printed here."""
    jax = _jax_gpu()
    import time

    from accelsweep.trainables.platforms import PLATFORMS
    from accelsweep.trainables.platforms.jax_trace import JaxDeviceTrace, work_by_batch

    a = jax.numpy.ones((4096, 4096), jax.numpy.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    trace = JaxDeviceTrace()
    trace.start()
    with trace.batch(0):
        start = time.perf_counter()
        for _ in range(50):
            out = matmul(a)
        out.block_until_ready()
        host_per_call = (time.perf_counter() - start) / 50
    work = work_by_batch(trace.stop_profile())[0]
    extent_per_call = (max(end for _, end in work) - work[0][0]) / 1e9 / 50
    windows = [PLATFORMS["cuda"].time_jax_calls(lambda: matmul(a), jax.block_until_ready, 20, 0.2) for _ in range(3)]
    busy_per_call = [sorted(w.step_seconds)[len(w.step_seconds) // 2] for w in windows]
    print(f"\njax 4096^3 matmul: host {host_per_call * 1e6:.1f} us, trace extent {extent_per_call * 1e6:.1f} us, "
          f"{len(work)} kernels/copies, busy (harness) {[round(b * 1e6, 1) for b in busy_per_call]} us, "
          f"idle between executions {(extent_per_call - busy_per_call[0]) * 1e6:.1f} us per call")
    assert all(w.timer == TracedWindow.timer for w in windows), windows[0].timer
    assert extent_per_call == pytest.approx(host_per_call, rel=0.05)
    assert all(0.85 * extent_per_call <= busy <= 1.01 * extent_per_call for busy in busy_per_call)


@pytest.mark.gpu
def test_a_launch_bound_jax_call_is_timed_by_its_kernels_below_its_dispatch():
    jax = _jax_gpu()

    from accelsweep.trainables.platforms import PLATFORMS

    x = jax.numpy.ones((1,), jax.numpy.float32)
    add = jax.jit(lambda v: v + 1)
    add(x).block_until_ready()
    for _ in range(3):
        window = PLATFORMS["cuda"].time_jax_calls(lambda: add(x), jax.block_until_ready, 200, 0.2)
        device = sorted(window.step_seconds)[len(window.step_seconds) // 2]
        enqueue = sorted(window.enqueue_seconds)[len(window.enqueue_seconds) // 2]
        print(f"\njax one-element add: device {device * 1e6:.2f} us, dispatch {enqueue * 1e6:.2f} us, {window.timer}")
        assert window.timer == TracedWindow.timer and device < enqueue and window.is_launch_bound(enqueue, device)


# The target of issue 18: launch-bound kernels (~40-100 us: Triton GIoU, SDPA flash/cuDNN,
# torchvision NMS, JAX per call) moved 8-21% window to window under per-call events.
CV_TARGET = 0.02


@pytest.mark.gpu
@pytest.mark.parametrize("op, impl, dtype", CUDA_CASES)
def test_every_cuda_implementation_repeats_within_the_cv_target_at_its_default_shape(op, impl, dtype):
    _needs_a_gpu()
    config = KernelConfig.make(op=op, impl=impl, platform="cuda", dtype=dtype, windows=5, window_min_s=0.3)
    try:
        result = run_microbench(config)
    except KernelUnavailable as missing:
        pytest.skip(str(missing))
    print(f"\nCV {op} {impl} {dtype}: p50 {result['latency_p50_s'] * 1e6:.1f} us, cv {result['latency_cv']:.2%}, "
          f"host enqueue {result['host_enqueue_s'] * 1e6:.1f} us, launch-bound {result['launch_bound']}, "
          f"{result['batch_calls']} calls/batch, max abs error {result['max_abs_error']:.2e} (tolerance "
          f"{get_op(op).tolerance[dtype]:.0e}), timer {result['timer']}")
    assert result["latency_cv"] <= CV_TARGET


@pytest.mark.gpu
def test_a_launch_bound_call_is_flagged_and_timed_below_its_launch():
    """A one-element add: the GPU's work is a few microseconds, the host's launch longer.
    The held figure must sit below the host's enqueue time, and be flagged."""
    _needs_a_gpu()
    import torch

    from accelsweep.trainables.platforms import PLATFORMS

    x = torch.ones(1, device="cuda")
    windows = [PLATFORMS["cuda"].time_calls(lambda: x + 1, x.device, 200, 0.2) for _ in range(3)]
    for window in windows:
        device = sorted(window.step_seconds)[len(window.step_seconds) // 2]
        enqueue = sorted(window.enqueue_seconds)[len(window.enqueue_seconds) // 2]
        assert window.is_launch_bound(enqueue, device), (device, enqueue)
