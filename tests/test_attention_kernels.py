"""Attention kernels: the reference is right, every implementation that runs on this CPU
matches it for every computation it claims, and the ones that cannot are refused (before
any trial) or say what to install. Nothing runs another kernel than the one asked for."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from accelsweep.kernels.attention import reference
from accelsweep.kernels.registry import KernelUnavailable, get_op
from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.harness.microbench import KernelConfig, run_microbench

SPEC = get_op("attention")


@pytest.fixture
def torch_impl():
    """The torch implementations, imported by the tests that call them: importing them loads
    FlexAttention, so torch's compiler (about 4 s), which collecting this file need not pay."""
    from accelsweep.kernels.attention import torch_impl

    return torch_impl
SMALL = dict(batch=2, heads=2, seq=64, head_dim=16)  # seq 64: an 8 x 8 patch grid
VARIANTS = {
    "plain": {},
    "causal": {"causal": True},
    "soft-cap": {"soft_cap": 2.0},  # small enough to bend unit-variance scores
    "neighborhood": {"neighborhood": 3},
    "causal-window": {"causal": True, "window": 9},
}


def brute_visible(seq, causal=False, window=0, neighborhood=0):
    side = int(seq ** 0.5)
    seen = np.zeros((seq, seq), dtype=bool)
    for i in range(seq):
        for j in range(seq):
            seen[i, j] = ((not causal or j <= i) and (not window or abs(i - j) < window)
                          and (not neighborhood or (abs(i // side - j // side) < neighborhood
                                                    and abs(i % side - j % side) < neighborhood)))
    return seen


@pytest.mark.parametrize("options", [dict(causal=True), dict(window=3), dict(neighborhood=2),
                                     dict(causal=True, window=4, neighborhood=3), {}])
def test_the_reference_masks_are_what_the_docstring_says(options):
    assert (reference.visible(16, **options) == brute_visible(16, **options)).all()
    assert reference.attended_pairs(16, **options) == brute_visible(16, **options).sum()
    assert reference.attended_pairs(100, causal=True) == 100 * 101 // 2


def test_the_reference_agrees_with_an_independent_float64_computation():
    """PyTorch's math SDPA in float64 with the reference's own mask, and soft-capping
    written out: the numpy reference is no better than this check of it."""
    q, k, v = (x.astype(np.float64) for x in reference.make_inputs(3, **SMALL))
    seen = reference.visible(64, causal=True, neighborhood=3)
    expected = F.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)),
                                              attn_mask=torch.from_numpy(seen)).numpy()
    np.testing.assert_allclose(reference.attention(q, k, v, causal=True, neighborhood=3), expected, atol=1e-12)

    scores = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(16)
    capped = 2.0 * np.tanh(scores / 2.0)
    weights = np.exp(capped - capped.max(-1, keepdims=True))
    soft_capped = np.einsum("bhqk,bhkd->bhqd", weights / weights.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(reference.attention(q, k, v, soft_cap=2.0), soft_capped, atol=1e-12)
    assert np.abs(soft_capped - reference.attention(q, k, v)).max() > 1e-2  # the cap does change the output


CPU_CASES = [(impl.name, variant, dtype) for impl in SPEC.impls_for("cpu") for variant in VARIANTS
             for dtype in SPEC.dtypes if dtype == "float32" or variant in ("plain", "soft-cap", "neighborhood")]


@pytest.mark.slow
@pytest.mark.parametrize("impl, variant, dtype", CPU_CASES)
def test_each_cpu_implementation_matches_or_refuses_each_variant(impl, variant, dtype):
    options = VARIANTS[variant]
    supports = SPEC.impl(impl).supports
    lacking = [name for name in options if supports is not None and name not in supports]
    make = lambda: KernelConfig.make(op="attention", impl=impl, dtype=dtype, warmup_calls=1, window_min_calls=2,
                                     window_min_s=0.0, windows=1, **SMALL, **options)
    if lacking:
        with pytest.raises(ConfigError, match=f"{lacking[0]} must be .* for impl {impl} .it does not implement"):
            make()
        return
    result = run_microbench(make())
    assert result["max_abs_error"] <= SPEC.tolerance[dtype]
    flops = 4.0 * 2 * 2 * 16 * reference.attended_pairs(64, **{k: v for k, v in options.items() if k != "soft_cap"})
    assert result["tflops"] == pytest.approx(flops / result["latency_p50_s"] / 1e12)


def test_a_wrong_mask_is_caught_by_the_check(monkeypatch, torch_impl):
    """The check is strict enough to see a one-diagonal masking slip (window off by one)."""
    correct = torch_impl.dense_mask.__wrapped__

    def off_by_one(seq, causal, window, neighborhood, device):
        return correct(seq, causal, window + 1 if window else 0, neighborhood, device)

    monkeypatch.setattr(torch_impl, "dense_mask", off_by_one)
    with pytest.raises(Exception, match="differs from the reference"):
        run_microbench(KernelConfig.make(op="attention", impl="naive", window=5, warmup_calls=1, window_min_calls=1,
                                         window_min_s=0.0, windows=1, **SMALL))


@pytest.mark.parametrize("name", ["sdpa_efficient", "sdpa_cudnn"])
def test_a_forced_sdpa_backend_raises_rather_than_running_another(name, torch_impl):
    """On CPU tensors the CUDA-only backends cannot run; SDPA's dispatcher would pick math
    or the CPU flash kernel. Forced, they raise."""
    q, k, v = (torch.from_numpy(x) for x in reference.make_inputs(0, **SMALL))
    with pytest.raises(RuntimeError, match="No viable backend|No available kernel"):
        getattr(torch_impl, name)(q, k, v)


def test_options_an_implementation_lacks_are_refused_before_any_trial(torch_impl):
    with pytest.raises(ConfigError, match=r"window must be 0 for impl sdpa-flash \(it does not implement window; "
                                          r"implementations that do: naive, naive-compile, sdpa-math, "
                                          r"sdpa-efficient, flex, flash-attn\); got 8"):
        KernelConfig.make(op="attention", impl="sdpa-flash", window=8)
    with pytest.raises(ConfigError, match="seq must be a square number of tokens .* with neighborhood > 0; got 50"):
        KernelConfig.make(op="attention", impl="naive", seq=50, neighborhood=5)
    with pytest.raises(ConfigError, match="causal must be True or False; got 1"):
        KernelConfig.make(op="attention", impl="naive", causal=1)
    with pytest.raises(ConfigError, match="impl must be an implementation that runs on cpu .* sdpa-cudnn runs on cuda"):
        KernelConfig.make(op="attention", impl="sdpa-cudnn")
    with pytest.raises(ConfigError, match="dtype must be one of bfloat16; got 'float32'"):
        KernelConfig.make(op="attention", impl="flash-attn", platform="cuda")
    # Called directly (not through the harness), an implementation refuses too.
    with pytest.raises(NotImplementedError, match="sdpa-math does not implement soft_cap"):
        torch_impl.sdpa_math(*(torch.zeros(1, 1, 4, 8) for _ in range(3)), soft_cap=30.0)


@pytest.mark.parametrize("impl, hint", [("flash-attn", "pip install flash-attn"), ("xformers", "pip install xformers"),
                                        ("transformer-engine", "transformer_engine")])
def test_gpu_only_libraries_say_what_to_install(impl, hint):
    implementation = SPEC.impl(impl)
    assert implementation.platforms == ("cuda",)
    try:
        implementation.load()
    except KernelUnavailable as missing:
        assert hint in str(missing)
    else:
        pytest.skip(f"{impl} is installed here")


@pytest.mark.slow
def test_attention_sweep_lands_one_run_per_implementation_of_the_variant(tmp_path, shared_ray):
    uri = f"sqlite:///{tmp_path}/k.db"
    done = subprocess.run([sys.executable, "sweeps/attention_kernels.py", "--smoke", "--platform", "cpu", "--variant", "soft-cap",
                           "--tracking-uri", uri, "--experiment", "A", "--storage-path", str(tmp_path / "ray"),
                           *shared_ray.flags],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "skipping sdpa-math: soft_cap must be 0.0 for impl sdpa-math" in done.stdout
    _, children = mlflow_runs(uri, "A")
    assert sorted(run.data.params["impl"] for run in children) == ["flex", "naive", "naive-compile"]
    for run in children:
        assert run.info.status == "FINISHED"
        assert run.data.params["soft_cap"] == "30.0"
        assert run.data.metrics["latency_p50_s"] > 0 and run.data.metrics["tflops"] > 0
        assert run.data.metrics["max_abs_error"] <= SPEC.tolerance["float32"]
        assert run.data.metrics["compile_s"] > 0
