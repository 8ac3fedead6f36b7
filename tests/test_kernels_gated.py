"""Kernels written for hardware this machine lacks, checked as far as a CPU honestly
allows: the Triton GIoU kernel under Triton's interpreter (in a subprocess: the switch
must be set before ``triton.jit`` runs), the NKI GIoU kernel in ``nki.simulate`` (skipped
where the ``nki`` package does not import, as here), the gating of the CUDA- and
Neuron-only implementations, and the sequential Pallas NMS kernel on edge cases."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from accelsweep.kernels.giou.reference import giou as giou_reference
from accelsweep.kernels.giou.reference import make_inputs as giou_inputs
from accelsweep.kernels.nms.reference import kept, nms
from accelsweep.kernels.registry import OPS, KernelUnavailable, get_op
from tests.conftest import REPO
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.harness.microbench import KernelConfig, run_microbench

GIOU_TOLERANCE = get_op("giou").tolerance["float32"]
# Boxes whose GIoU is known exactly: identical (1), far apart (below -0.5), side by side (0).
SPECIAL_PAIRS = ([[0.1, 0.1, 0.4, 0.4], [0.1, 0.1, 0.4, 0.4]],
                 [[0.0, 0.0, 0.1, 0.1], [0.8, 0.8, 0.9, 0.9]],
                 [[0.0, 0.0, 0.5, 0.5], [0.5, 0.0, 1.0, 0.5]])


def _module_imports(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


# --- Triton: the kernel's arithmetic under the interpreter -------------------------

TRITON_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from accelsweep.kernels.giou.reference import giou, make_inputs
    from accelsweep.kernels.giou import triton_impl

    special = np.array(json.loads(sys.argv[1]), dtype=np.float32)
    cases = {}
    # (batch, boxes, block_pairs): one exact block, a ragged last block, many small blocks.
    for batch, boxes, block in ((1, 256, 256), (3, 37, 64), (4, 32, 16)):
        boxes1, boxes2 = make_inputs(7, batch, boxes)
        got = triton_impl.giou_triton(torch.from_numpy(boxes1), torch.from_numpy(boxes2), block_pairs=block)
        cases[f"{batch}x{boxes}/{block}"] = float(np.abs(got.numpy() - giou(boxes1, boxes2)).max())
    got = triton_impl.giou_triton(torch.from_numpy(special[:, 0]), torch.from_numpy(special[:, 1]))
    print(json.dumps({"kernel_type": type(triton_impl._giou_kernel).__name__, "max_abs_error": cases,
                      "special": got.tolist(), "special_reference": giou(special[:, 0], special[:, 1]).tolist()}))
""")


@pytest.mark.slow
def test_triton_giou_matches_the_reference_under_the_interpreter():
    pytest.importorskip("triton", reason="triton is not installed")
    done = subprocess.run([sys.executable, "-c", TRITON_CHILD, json.dumps(SPECIAL_PAIRS)], cwd=REPO,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kernel_type"] == "InterpretedFunction"  # the interpreter ran it, nothing else
    assert all(error <= GIOU_TOLERANCE for error in result["max_abs_error"].values()), result["max_abs_error"]
    assert np.allclose(result["special"], result["special_reference"], atol=GIOU_TOLERANCE)
    identical, disjoint, touching = result["special"]
    assert identical == pytest.approx(1.0) and disjoint < -0.5 and touching == pytest.approx(0.0, abs=1e-6)


@pytest.mark.gpu
def test_triton_giou_through_the_harness_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = run_microbench(KernelConfig.make(op="giou", impl="triton-fused", platform="cuda", batch=64,
                                              boxes=256, warmup_calls=2, window_min_calls=5, window_min_s=0.0,
                                              windows=1))
    assert result["max_abs_error"] <= GIOU_TOLERANCE and result["timer"] == "cuda events around a held batch"


def test_triton_block_pairs_must_be_a_power_of_two():
    with pytest.raises(ConfigError, match="block_pairs must be a power of two .*; got 96"):
        KernelConfig.make(op="giou", impl="triton-fused", platform="cuda", block_pairs=96)
    assert KernelConfig.make(op="giou", impl="triton-fused", platform="cuda", block_pairs=128).impl_tuning() == {
        "block_pairs": 128}


# --- NKI: the kernel in the package's CPU simulator ----------------------------------

def test_nki_giou_matches_the_reference_in_the_simulator(monkeypatch):
    try:
        import nki
    except ImportError as error:  # PyPI's 'nki' is a placeholder that raises ImportError too
        pytest.skip(f"the nki package (Neuron pip repository) does not import here: {error}")
    # Simulate a NeuronCore-v2, seed 004's inf2 (the simulator's default is trn3).
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    from accelsweep.kernels.giou.nki_impl import PAIRS_PER_PARTITION, giou_kernel

    # 2 pairs per partition; then one full tile and a 3-pair remainder per partition.
    for batch, boxes in ((1, 256), (2, 64 * (PAIRS_PER_PARTITION + 3))):
        boxes1, boxes2 = giou_inputs(3, batch, boxes)
        got = np.asarray(nki.simulate(giou_kernel)(boxes1, boxes2))
        assert got.shape == (batch, boxes) and not np.isnan(got).any()  # NaN: a tile never written
        assert np.abs(got - giou_reference(boxes1, boxes2)).max() <= GIOU_TOLERANCE


def test_nki_shapes_must_fill_the_partitions():
    check = get_op("giou").impl("nki").check
    check(shape={"batch": 1, "boxes": 256}, options={}, tuning={}, dtype="float32", platform="neuron")
    with pytest.raises(ConfigError, match="batch \\* boxes a multiple of 128 .*batch is 3.*; got 5"):
        check(shape={"batch": 3, "boxes": 5}, options={}, tuning={}, dtype="float32", platform="neuron")


@pytest.mark.neuron
def test_neuron_giou_kernels_on_a_neuroncore():
    """For a trn1/inf2 instance; the harness cannot run neuron trials yet, so this calls
    the kernels directly on the XLA device."""
    if not _module_imports("torch_neuronx"):
        pytest.skip("needs torch-neuronx on a NeuronCore")
    import torch
    import torch_xla

    device = torch_xla.device()
    boxes1, boxes2 = giou_inputs(0, 8, 256)
    for impl in ("nki", "gpsimd-cpp"):
        kernel = get_op("giou").impl(impl).load()
        got = kernel(torch.from_numpy(boxes1).to(device), torch.from_numpy(boxes2).to(device)).cpu().numpy()
        assert np.abs(got - giou_reference(boxes1, boxes2)).max() <= GIOU_TOLERANCE, impl


# --- Gating: what cannot run here says so, and why ------------------------------------

HARDWARE_ONLY = sorted((op, impl.name) for op in OPS for impl in get_op(op).implementations
                       if "cpu" not in impl.platforms)


def test_the_hardware_only_implementations_are_the_expected_ones():
    assert {("giou", "triton-fused"), ("giou", "nki"), ("giou", "gpsimd-cpp")} <= set(HARDWARE_ONLY)


@pytest.mark.parametrize("op, impl", HARDWARE_ONLY)
def test_hardware_only_implementations_are_refused_on_the_cpu_with_their_platforms(op, impl):
    platforms = ", ".join(get_op(op).impl(impl).platforms)
    with pytest.raises(ConfigError, match=f"got '{impl}'. {impl} runs on {platforms}"):
        KernelConfig.make(op=op, impl=impl, platform="cpu")


def test_neuron_kernel_trials_hold_a_neuron_core_and_fail_loudly_without_one():
    """NKI, GpSimd and the PyTorch baseline run as trials on platform neuron (seed 004's
    comparison); each trial holds a NeuronCore. Here there is none: the trial fails with
    the reason, nothing is timed on the CPU instead."""
    from accelsweep.trainables.platforms import PLATFORM_NAMES, get_platform

    assert "neuron" in PLATFORM_NAMES
    nki = KernelConfig.make(op="giou", impl="nki", platform="neuron", batch=1, boxes=256)
    assert get_platform("neuron").resources(nki) == {"CPU": 1, "neuron_cores": 1}
    assert {"torch-naive", "nki", "gpsimd-cpp"} <= {i.name for i in get_op("giou").impls_for("neuron")}
    baseline = KernelConfig.make(op="giou", impl="torch-naive", platform="neuron", batch=1, boxes=256)
    with pytest.raises(KernelUnavailable, match=r"platform neuron needs torch-xla \(|platform neuron needs torch-xla "
                                                "on NEURON, but its device is"):
        run_microbench(baseline)


def test_jax_kernels_fail_rather_than_time_the_wrong_backend(monkeypatch):
    """Asked for a TPU (or a GPU), JAX on a CPU-only install would silently run on its CPU
    backend; the harness refuses to time that."""
    from accelsweep.trainables.platforms import get_platform

    import jax

    monkeypatch.setenv("PJRT_DEVICE", "CPU")  # restored after: a tpu kernel trial sets it to TPU
    here = jax.devices()[0].platform  # cpu in CI; gpu on a GPU machine
    for platform, backend in (("tpu", "tpu"), ("cuda", "gpu")):
        if backend == here:
            continue  # JAX is on that backend here: nothing to refuse
        config = KernelConfig.make(op="giou", impl="jax-jit", platform=platform, batch=2, boxes=16)
        with pytest.raises(KernelUnavailable, match=f"platform {platform} asks for JAX's {backend} backend, "
                                                    f"but JAX runs on {here} here"):
            run_microbench(config)
    tpu = KernelConfig.make(op="matmul", impl="pallas", platform="tpu", m=128, k=128, n=128)
    assert get_platform("tpu").resources(tpu) == {"CPU": 1, "TPU": 1}
    assert tpu.trial_env() == {"PJRT_DEVICE": "TPU"}


@pytest.mark.parametrize("impl, stack, names", [
    ("nki", "nki", ("the nki package", "torch-neuronx")),
    ("gpsimd-cpp", "torch_neuronx", ("torch-neuronx", "aws-neuronx-gpsimd-customop-lib")),
])
def test_a_missing_neuron_stack_raises_kernel_unavailable_naming_what_to_install(impl, stack, names):
    if _module_imports(stack):
        pytest.skip(f"{stack} is installed here")
    with pytest.raises(KernelUnavailable) as raised:
        get_op("giou").impl(impl).load()
    message = str(raised.value)
    # The cause is the missing stack itself, not a broken import inside the module.
    assert message.startswith(f"{impl} needs ") and f"No module named '{stack}'" in message
    assert all(name in message for name in names), message


def test_the_gpsimd_operator_names_agree_across_python_and_cpp():
    """torch.ops.<library>.<op> in Python, NEURON_LIBRARY/m.def in shape.cpp and the compute
    function in giou.cpp are matched only by name, at run time on a Neuron instance."""
    def read(path):
        with open(os.path.join(REPO, path)) as source:
            return source.read()

    python, shape, compute = (read("kernels/giou/gpsimd_impl.py"), read("kernels/giou/gpsimd/shape.cpp"),
                              read("kernels/giou/gpsimd/giou.cpp"))
    assert "torch.ops.accelsweep.giou" in python
    assert "NEURON_LIBRARY(accelsweep, m)" in shape and 'm.def("giou", &giou_shape, "giou_compute")' in shape
    assert "torch::Tensor giou_compute(const torch::Tensor& boxes1, const torch::Tensor& boxes2)" in compute
    assert "torch::Tensor giou_shape(torch::Tensor boxes1, torch::Tensor boxes2)" in shape


# --- The sequential Pallas NMS kernel (interpret mode) on edge cases ----------------

def _pallas_keeps(boxes, scores):
    from accelsweep.kernels.nms.pallas_impl import nms_pallas

    mask = np.asarray(nms_pallas(np.asarray(boxes, np.float32), np.asarray(scores, np.float32)))
    assert mask.dtype == bool and mask.shape == (len(boxes),)
    return kept(mask)


def _reference_keeps(boxes, scores):
    return kept(nms(np.asarray(boxes, np.float32).astype(np.float64), np.asarray(scores, np.float32)))


NMS_CASES = {
    # Five copies of one box: only the best-scored survives.
    "all overlapping": ([[0.2, 0.2, 0.6, 0.6]] * 5, [0.3, 0.9, 0.1, 0.5, 0.7], [1]),
    # A row of disjoint boxes: all survive.
    "none overlapping": ([[0.1 * i, 0.0, 0.1 * i + 0.05, 0.05] for i in range(9)], np.linspace(0.9, 0.1, 9),
                         list(range(9))),
    "a single box": ([[0.1, 0.1, 0.3, 0.3]], [0.4], [0]),
    # A overlaps B, B overlaps C, A not C: B is suppressed by A, so B cannot suppress C.
    "a chain": ([[0.0, 0.0, 1.0, 1.0], [0.2, 0.0, 1.2, 1.0], [0.4, 0.0, 1.4, 1.0]], [0.9, 0.8, 0.7], [0, 2]),
    # IoU exactly 0.5 (1 / 2) is not above the threshold: both survive.
    "IoU at the threshold": ([[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 1.0]], [0.9, 0.8], [0, 1]),
    # Tied scores: visited in input order, as the reference's stable sort does.
    "tied scores": ([[0.0, 0.0, 1.0, 1.0], [0.05, 0.0, 1.05, 1.0]], [0.5, 0.5], [0]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", NMS_CASES)
def test_pallas_nms_edge_cases(case):
    boxes, scores, expected = NMS_CASES[case]
    assert list(_reference_keeps(boxes, scores)) == expected  # the case means what it says
    assert list(_pallas_keeps(boxes, scores)) == expected


def test_pallas_nms_lowers_to_a_mosaic_tpu_call():
    """Weak but real: every operation in the kernel has a Pallas-to-Mosaic lowering rule.
    libtpu's Mosaic compiler (layouts, memory spaces) is not available here."""
    import functools

    import jax
    from jax import export

    from accelsweep.kernels.nms.pallas_impl import _nms

    box_rows, scores = jax.ShapeDtypeStruct((300, 4), np.float32), jax.ShapeDtypeStruct((300,), np.float32)
    exported = export.export(jax.jit(functools.partial(_nms, interpret=False)), platforms=["tpu"])(box_rows, scores)
    assert "tpu_custom_call" in exported.mlir_module()


@pytest.mark.parametrize("count", [127, 300])
def test_pallas_nms_matches_the_reference_when_boxes_are_padded(count):
    """Box counts that are not a power of two: the kernel pads its lanes (to 128, 512)."""
    from accelsweep.kernels.nms.reference import make_inputs

    boxes, scores = make_inputs(11, count)
    expected = _reference_keeps(boxes, scores)
    assert 0 < len(expected) < count  # some suppression happens, or the test proves little
    assert np.array_equal(_pallas_keeps(boxes, scores), expected)
