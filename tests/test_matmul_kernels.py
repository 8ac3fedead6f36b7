"""The matmul op: every implementation that runs here matches the reference exactly,
block shapes a TPU could not run are refused before anything runs, a wrong kernel is
caught before it is timed, and the Pallas block-size sweep runs end to end."""

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from accelsweep.kernels.matmul.checks import TPU_VMEM_BUDGET_BYTES, vmem_bytes
from accelsweep.kernels.registry import KernelImpl, get_op
from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.harness.microbench import KernelConfig, KernelMismatch, run_microbench

# Two blocks along every axis: the kernel must zero, accumulate over k and write back.
SMALL = dict(m=64, k=256, n=256)
SMALL_BLOCKS = dict(bm=32, bk=128, bn=128)
FAST = dict(warmup_calls=1, window_min_calls=2, window_min_s=0.0, windows=1)
SPEC = get_op("matmul")
CPU_CASES = [(impl.name, dtype) for impl in SPEC.impls_for("cpu") for dtype in impl.dtypes or SPEC.dtypes]


def small_config(impl, dtype="int8", **values):
    blocks = SMALL_BLOCKS if impl == "pallas" else {}
    return KernelConfig.make(op="matmul", impl=impl, dtype=dtype, **{**SMALL, **blocks, **FAST, **values})


def test_every_dtype_is_covered_on_this_cpu():
    assert sorted(CPU_CASES) == sorted([("jax-dot", "int8"), ("jax-dot", "bfloat16"), ("jax-dot", "float32"),
                                        ("torch-matmul", "int8"), ("torch-matmul", "float32"),
                                        ("pallas", "int8"), ("pallas", "bfloat16"), ("pallas", "float32")])


@pytest.mark.parametrize("impl, dtype", CPU_CASES)
def test_every_implementation_matches_the_reference_exactly(impl, dtype):
    result = run_microbench(small_config(impl, dtype))
    assert result["max_abs_error"] == 0.0
    p50 = result["latency_p50_s"]
    assert p50 > 0
    assert result["tflops"] == pytest.approx(2 * 64 * 256 * 256 / p50 / 1e12)
    assert result["items_per_s"] == pytest.approx(64 * 256 / p50)
    interpreted = impl == "pallas"
    assert result["interpreted"] == int(interpreted)
    assert ("not a speed figure" in result["device"]) == interpreted


def test_inputs_are_integers_every_dtype_holds():
    a, b = SPEC.make_inputs(0, m=64, k=512, n=32)
    assert a.dtype == np.float32 and b.dtype == np.float32  # floating: the harness casts them to the dtype
    for array in (a, b):
        assert np.array_equal(array, np.round(array)) and array.min() == -128 and array.max() == 127


def test_a_kernel_that_drops_the_last_k_block_fails_before_timing(monkeypatch):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    import accelsweep.kernels.matmul.pallas_impl as pallas_impl

    def drops_last_k_block(a_ref, b_ref, out_ref):
        @pl.when(pl.program_id(2) == 0)
        def _start():
            out_ref[...] = jnp.zeros_like(out_ref)

        @pl.when(pl.program_id(2) < pl.num_programs(2) - 1)
        def _accumulate():
            out_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=out_ref.dtype)

    monkeypatch.setattr(pallas_impl, "_matmul_kernel", drops_last_k_block)
    jax.clear_caches()  # the jitted matmul was traced with the right kernel by earlier tests
    try:
        with pytest.raises(KernelMismatch, match="pallas differs from the reference by .* not timed"):
            run_microbench(small_config("pallas", "int8"))
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    assert run_microbench(small_config("pallas", "int8"))["max_abs_error"] == 0.0


def bfloat16_output(a, b):
    import jax.numpy as jnp

    return jnp.dot(a, b)  # bfloat16 in, bfloat16 out: the sums are rounded to 8 significant bits


def test_tolerance_zero_catches_a_bfloat16_result(monkeypatch):
    import accelsweep.kernels.matmul as matmul_op

    rounded = KernelImpl("bf16-out", f"{__name__}:bfloat16_output", "jax", ("cpu",), "jax", dtypes=("bfloat16",))
    monkeypatch.setattr(matmul_op, "SPEC", dataclasses.replace(
        SPEC, implementations=SPEC.implementations + (rounded,)))
    with pytest.raises(KernelMismatch, match="bf16-out differs from the reference"):
        run_microbench(small_config("bf16-out", "bfloat16"))


@pytest.mark.parametrize("values, message", [
    (dict(bm=48), "bm must be a divisor of m (64); got 48"),
    (dict(bn=96), "bn must be a divisor of n (256); got 96"),
    (dict(bm=16), "bm must be a multiple of 32 or all of m (64): TPU tiles int8 blocks in 32 x 128; got 16"),
    (dict(bk=64), "bk must be a multiple of 128 or all of k (256): TPU tiles int8 blocks in 32 x 128; got 64"),
    (dict(bm=8, dtype="bfloat16"),
     "bm must be a multiple of 16 or all of m (64): TPU tiles bfloat16 blocks in 16 x 128; got 8"),
    (dict(m=2048, k=2048, n=2048, bm=1024, bk=2048, bn=2048),
     "bm, bk, bn must be blocks within the 16 MiB TPU VMEM budget (2 x (bm*bk + bk*bn) x 1 B inputs + "
     "2 x bm*bn x 4 B output, double-buffered); got (1024, 2048, 2048). Those blocks need 28 MiB: make one smaller."),
    (dict(m=1, k=131072, n=1, bm=1, bk=131072, bn=1),
     "k must be at most 131071 for int8 (k * 128 * 128 must fit the int32 accumulator); got 131072"),
])
def test_pallas_block_shapes_that_a_tpu_cannot_run_are_refused(values, message):
    with pytest.raises(ConfigError) as refused:
        small_config("pallas", **values)
    assert str(refused.value) == message


def test_blocks_that_tiling_allows_are_accepted():
    small_config("pallas", bm=16, dtype="bfloat16")  # 16 rows: a bfloat16 tile
    small_config("pallas", bm=8, dtype="float32")
    small_config("pallas", m=48, bm=48, bk=256, bn=256)  # a block spanning the whole dim needs no tiling
    # Exactly at the budget is allowed: 2 x 2 x 1024^2 x 2 B inputs + 2 x 1024^2 x 4 B output = 16 MiB.
    assert vmem_bytes(1024, 1024, 1024, "bfloat16") == TPU_VMEM_BUDGET_BYTES
    small_config("pallas", dtype="bfloat16", m=1024, k=1024, n=1024, bm=1024, bk=1024, bn=1024)


def test_library_implementations_are_checked_too():
    with pytest.raises(ConfigError, match=r"^k must be at most 131071 for int8"):
        KernelConfig.make(op="matmul", impl="jax-dot", dtype="int8", m=1, k=131072, n=1)
    KernelConfig.make(op="matmul", impl="jax-dot", dtype="float32", m=1, k=131072, n=1)
    with pytest.raises(ConfigError, match=r"^m must be greater than 16 for int8 on cuda \(torch._int_mm, cuBLAS\); "
                                          r"got 16$"):
        KernelConfig.make(op="matmul", impl="torch-matmul", platform="cuda", dtype="int8", m=16, k=64, n=64)
    with pytest.raises(ConfigError, match=r"^n must be a multiple of 8 for int8 on cuda .*; got 60$"):
        KernelConfig.make(op="matmul", impl="torch-matmul", platform="cuda", dtype="int8", m=32, k=64, n=60)
    with pytest.raises(ConfigError, match=r"^dtype must be one of int8, float32; got 'bfloat16'"):
        KernelConfig.make(op="matmul", impl="torch-matmul", dtype="bfloat16")
    with pytest.raises(ConfigError, match=r"^impl must be an implementation that runs on cuda \(jax-dot, "
                                          r"torch-matmul\); got 'pallas'"):
        KernelConfig.make(op="matmul", impl="pallas", platform="cuda")
    with pytest.raises(ConfigError, match=r"^bm must be 128 for impl jax-dot"):
        KernelConfig.make(op="matmul", impl="jax-dot", bm=64)


def sweep_args(**values):
    args = dict(platform="auto", dtype="int8", seed=0, smoke=True, num_samples=None, time_budget_s=None,
                scheduler="none", tracking_uri="sqlite:///unused.db", experiment=None, storage_path=None,
                address=None, max_concurrent_trials=None, resume=False, retries=1)
    return SimpleNamespace(**{**args, **values})


def test_the_sweep_refuses_any_block_shape_that_cannot_run():
    from accelsweep.sweeps.pallas_matmul import SMOKE_SHAPE, build_sweep

    with pytest.raises(ConfigError) as refused:
        build_sweep(sweep_args(), SMOKE_SHAPE, {"bm": (32, 128), "bk": (128, 256), "bn": (128, 96)})
    assert str(refused.value) == (
        "bn must be valid for every block shape the sweep can propose; got {'bm': 32, 'bk': 128, 'bn': 96}. "
        "Refused before any trial: bn must be a divisor of n (256); got 96")
    # Every combination is checked, not a sample: here only the largest of 8 is over the VMEM budget.
    with pytest.raises(ConfigError, match=r"got \{'bm': 1024, 'bk': 2048, 'bn': 1024\}\. Refused before any "
                                          r"trial: bm, bk, bn must be blocks within the 16 MiB .* need 24 MiB"):
        build_sweep(sweep_args(dtype="bfloat16"), dict(m=2048, k=2048, n=2048),
                    {"bm": (128, 1024), "bk": (128, 2048), "bn": (128, 1024)})
    with pytest.raises(ConfigError, match=r"^--platform must be one the pallas kernel runs on \(cpu, tpu\); "
                                          r"got 'cuda'$"):
        build_sweep(sweep_args(platform="cuda"), SMOKE_SHAPE, {"bm": (128,), "bk": (128,), "bn": (128,)})


def test_the_library_is_the_baseline_and_every_searched_trial_is_the_kernel():
    import optuna

    from accelsweep import plan_sweep
    from accelsweep.sweeps.pallas_matmul import SMOKE_BLOCKS, SMOKE_SHAPE, build_sweep

    plan = plan_sweep(build_sweep(sweep_args(), SMOKE_SHAPE, SMOKE_BLOCKS))
    assert plan.baseline_point == {"impl": "jax-dot", "bm": 128, "bk": 128, "bn": 128}
    # As the searcher runs it (sweeps/driver/run/lifecycle.py): the baseline enqueued first, then TPE.
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=2))
    study.enqueue_trial(plan.baseline_point)
    proposed = []
    for number in range(12):
        trial = study.ask()
        params = plan.sweep.space(trial) or {}
        proposed.append({**trial.params, **params})
        study.tell(trial, 1.0 if number == 0 else 2.0 + number)  # the library is fastest, as on a CPU
    assert proposed[0] == plan.baseline_point
    assert all(point["impl"] == "pallas" for point in proposed[1:])
    assert len({(p["bm"], p["bk"], p["bn"]) for p in proposed[1:]}) > 1


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_says_interpreted_times_are_not_speed_figures():
    done = subprocess.run([sys.executable, "sweeps/pallas_matmul.py", "--dry-run", "--smoke", "--dtype", "bfloat16"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "baseline: {'impl': 'jax-dot', 'bm': 128, 'bk': 128, 'bn': 128}" in done.stdout
    assert "bm: one of 32, 64, 128" in done.stdout
    assert "cpu, bfloat16, m x k x n = 128 x 256 x 256" in done.stdout
    assert "interpret mode" in done.stdout and "not a speed figure" in done.stdout
    refused = subprocess.run([sys.executable, "sweeps/pallas_matmul.py", "--dry-run", "--platform", "cuda"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    assert "error: --platform must be one the pallas kernel runs on (cpu, tpu); got 'cuda'" in refused.stderr


@pytest.mark.slow
@pytest.mark.alone  # beside another test's sweep it left a fifth run once (cause not pinned): the count is a quiet machine's
def test_smoke_sweep_lands_in_mlflow(tmp_path, shared_ray):
    uri = f"sqlite:///{tmp_path}/m.db"
    done = subprocess.run([sys.executable, "sweeps/pallas_matmul.py", "--smoke", "--tracking-uri", uri,
                           "--experiment", "M", "--storage-path", str(tmp_path / "ray"), *shared_ray.flags],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parents, children = mlflow_runs(uri, "M")
    assert len(parents) == 1 and len(children) == 4
    baseline = [run for run in children if run.data.tags.get("baseline") == "true"]
    assert [run.data.params["impl"] for run in baseline] == ["jax-dot"]
    assert sorted(run.data.params["impl"] for run in children) == ["jax-dot", "pallas", "pallas", "pallas"]
    for run in children:
        assert run.info.status == "FINISHED"
        assert run.data.metrics["latency_p50_s"] > 0 and run.data.metrics["tflops"] > 0
        assert run.data.metrics["max_abs_error"] == 0.0
        assert run.data.metrics["interpreted"] == (run.data.params["impl"] == "pallas")
    assert "(interpreted: not ranked)" in done.stdout
    assert "3 Pallas trial(s) ran in interpret mode" in done.stdout
