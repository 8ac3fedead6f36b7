"""What the hardware could do: the peak a trial's achieved TFLOP/s is a fraction of.

Two kinds of figure, never confused: **datasheet**, the vendor's published dense (no
sparsity) peak for a precision, per device (a GPU, a NeuronCore, a TPU chip), its source
cited beside it in ``DATASHEET`` and never called measured; **measured here**, on a CPU,
what a large GEMM reaches on the cores the trial holds (``measure_cpu_peak``, cached per
machine), beside the theoretical one from the ISA and the clock (``cpu_theoretical_peak``).

    from accelsweep.trainables.peaks import peak_for
    peak = peak_for("cpu", "fp32", devices=1, threads=2)   # measured here (cached)
    peak.tflops, peak.basis, peak.theoretical_tflops

A leaf module: torch is imported only to measure.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import platform as host
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from accelsweep.trainables.contention import ContentionMeter
from accelsweep.trainables.compile_cache import default_root
from accelsweep.trainables.platforms.cpu import parse_cpuinfo

__all__ = ["DATASHEET", "DatasheetPeak", "Peak", "cpu_theoretical_peak", "datasheet_peak", "measure_cpu_bandwidth",
           "measure_cpu_peak", "peak_for", "precision_dtype"]

# Which element type a precision's matmuls run in (trainables/precision.py): the
# autocast dtype where it autocasts, else the weights'.
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "bf16-autocast": "bfloat16", "fp16-autocast": "float16"}


def precision_dtype(precision: str) -> str:
    """The dtype a precision's (or a kernel's dtype's) matmuls run in."""
    return PRECISION_DTYPES.get(precision, precision)


@dataclass(frozen=True)
class DatasheetPeak:
    """One device's published dense peaks (TFLOP/s by dtype) and memory bandwidth (GB/s)."""

    device: str  # what one unit is: "H100 SXM5 GPU", "NeuronCore-v2"
    tflops: Mapping[str, float]
    bandwidth_gb_s: float
    source: str
    note: str = ""


# Dense peaks (sparsity off), per unit a trial holds: a GPU, a NeuronCore, a TPU chip.
# For fp32 on a GPU: plain FP32 (CUDA cores), since torch's default leaves TF32 off for matmuls.
DATASHEET: dict[str, DatasheetPeak] = {
    "H100-SXM": DatasheetPeak(
        "H100 SXM5 GPU", {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4, "float8": 1978.9},
        3350.0, "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100), SXM5 column; "
                "its tensor figures are with sparsity, halved here"),
    "H100-PCIe": DatasheetPeak(
        "H100 PCIe GPU", {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0, "float8": 1513.0},
        2000.0, "NVIDIA H100 Tensor Core GPU datasheet, PCIe column; tensor figures halved from the sparse ones"),
    "A100": DatasheetPeak(
        "A100 SXM4 80GB GPU", {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0},
        2039.0, "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), 80GB SXM column"),
    "A10G": DatasheetPeak(
        "A10G GPU", {"float32": 31.2, "tf32": 62.5, "bfloat16": 125.0, "float16": 125.0},
        600.0, "NVIDIA A10 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/products/a10-gpu)",
        note="NVIDIA publishes no A10G datasheet: the figures are the A10's, whose AWS variant (g5) it is"),
    "L4": DatasheetPeak(
        "L4 GPU", {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0, "float16": 121.0, "float8": 242.5},
        300.0, "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4); tensor figures halved "
               "from the sparse ones"),
    # A Trainium (trn1) or Inferentia2 (inf2) chip holds 2 NeuronCore-v2: "190 FP16/BF16/cFP8/TF32
    # TFLOPS, and 47.5 FP32 TFLOPS", 820 GiB/s (awsdocs-neuron, arch/neuron-hardware/trainium.html
    # and inferentia2.html); per core, half.
    "NeuronCore-v2": DatasheetPeak(
        "NeuronCore-v2 (trn1, inf2)", {"float32": 23.75, "tf32": 95.0, "bfloat16": 95.0, "float16": 95.0},
        440.3, "AWS Neuron docs, Trainium and Inferentia2 architecture: a chip's 190 BF16/FP16/TF32 and 47.5 "
               "FP32 TFLOPS and 820 GiB/s over its 2 NeuronCore-v2"),
    # A Trainium2 chip: 8 NeuronCore-v3, "667 BF16/FP16/TF32 TFLOPS, 181 FP32 TFLOPS", 2.9 TB/s
    # (awsdocs-neuron, arch/neuron-hardware/trainium2.html); per core, an eighth.
    "NeuronCore-v3": DatasheetPeak(
        "NeuronCore-v3 (trn2)", {"float32": 22.6, "tf32": 83.4, "bfloat16": 83.4, "float16": 83.4, "float8": 162.4},
        362.5, "AWS Neuron docs, Trainium2 architecture: a chip's 667 BF16 / 181 FP32 / 1,299 FP8 TFLOPS and "
               "2.9 TB/s over its 8 NeuronCore-v3"),
    # Per chip, bf16 (cloud.google.com/tpu/docs/<version>, "system architecture").
    "TPU-v4": DatasheetPeak("TPU v4 chip", {"bfloat16": 275.0}, 1200.0, "Google Cloud TPU v4 documentation"),
    "TPU-v5e": DatasheetPeak("TPU v5e chip", {"bfloat16": 197.0}, 819.0, "Google Cloud TPU v5e documentation"),
    "TPU-v5p": DatasheetPeak("TPU v5p chip", {"bfloat16": 459.0}, 2765.0, "Google Cloud TPU v5p documentation"),
    "TPU-v6e": DatasheetPeak("TPU v6e (Trillium) chip", {"bfloat16": 918.0}, 1640.0,
                             "Google Cloud TPU v6e documentation"),
}

# How a device names itself (torch.cuda.get_device_name, a TPU's device_kind, the Neuron
# platform's device) -> its DATASHEET entry; the first match wins.
DEVICE_NAME_PATTERNS = (
    ("H100 PCIe", "H100-PCIe"), ("H100", "H100-SXM"), ("A100", "A100"), ("A10G", "A10G"), ("L4", "L4"),
    ("NeuronCore-v3", "NeuronCore-v3"), ("trn2", "NeuronCore-v3"), ("NeuronCore", "NeuronCore-v2"),
    ("trn1", "NeuronCore-v2"), ("inf2", "NeuronCore-v2"),
    ("v6", "TPU-v6e"), ("v5p", "TPU-v5p"), ("v5", "TPU-v5e"), ("v4", "TPU-v4"),
)


def datasheet_peak(device_name: str) -> Optional[DatasheetPeak]:
    for pattern, key in DEVICE_NAME_PATTERNS:
        if pattern.lower() in device_name.lower():
            return DATASHEET[key]
    return None


@dataclass(frozen=True)
class Peak:
    """The peak a trial is held against: ``tflops`` for all the devices it holds together,
    how that was found (``basis``), and whether it was measured here."""

    tflops: float
    dtype: str
    basis: str
    measured: bool
    theoretical_tflops: float = math.nan
    theoretical_basis: str = ""
    bandwidth_gb_s: float = math.nan
    bandwidth_basis: str = ""
    conditions: Mapping[str, object] = field(default_factory=dict)

    def fields(self) -> dict:
        """What a result carries about it."""
        return {"peak_tflops": self.tflops, "peak_tflops_theoretical": self.theoretical_tflops,
                "peak_basis": self.basis, "peak_theoretical_basis": self.theoretical_basis,
                "peak_measured": float(self.measured), "peak_dtype": self.dtype}


# --- the CPU's theoretical peak --------------------------------------------------------

# FLOPs per cycle per core for fp32 FMA: lanes x 2 (multiply and add) x FMA pipes. Two pipes
# is what Intel since Haswell (Skylake-SP Gold 6/Platinum for AVX-512) and AMD since Zen 2
# have; a core with one is overstated by 2x here, which the basis says.
FP32_FLOPS_PER_CYCLE = (("avx512f", 64), ("avx2", 32), ("asimd", 16))  # 512-, 256-, 128-bit lanes
# Native bf16 dot products double the fp32 rate (AVX512-BF16's VDPBF16PS); AMX's tile unit does
# 1024 bf16 FLOPs per cycle per core (Intel's optimization manual, AMX chapter).
BF16_FLOPS_PER_CYCLE = (("amx_bf16", 1024), ("avx512_bf16", 128))


def cpu_clock_ghz(cpuinfo: str, sysfs: str = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
                  ) -> tuple[float, str]:
    """The core clock and where it came from: the maximum frequency cpufreq reports, else
    /proc/cpuinfo's current "cpu MHz", else half its "bogomips" (on x86, twice the TSC
    rate: the nominal clock a VM without cpufreq shows; boost can exceed it)."""
    with contextlib.suppress(OSError, ValueError):
        with open(sysfs) as khz:
            return int(khz.read()) / 1e6, "cpufreq's cpuinfo_max_freq"
    values: dict[str, float] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("cpu mhz", "bogomips") and key not in values:
            with contextlib.suppress(ValueError):
                values[key] = float(value)
    if "cpu mhz" in values:
        return values["cpu mhz"] / 1e3, "/proc/cpuinfo's cpu MHz"
    if "bogomips" in values:
        return values["bogomips"] / 2e3, "/proc/cpuinfo's bogomips / 2 (the TSC rate; boost may exceed it)"
    return math.nan, "no clock in /proc/cpuinfo or cpufreq"


def cpu_theoretical_peak(cpuinfo: str, cores: int, dtype: str) -> tuple[float, str]:
    """Cores x clock x FLOPs per cycle for ``dtype``, in TFLOP/s, and the sum written out.
    A dtype the CPU does not multiply natively (bf16 without AVX512-BF16 or AMX) runs at
    the fp32 rate at best (converted to fp32)."""
    _, flags = parse_cpuinfo(cpuinfo)
    ghz, clock_source = cpu_clock_ghz(cpuinfo)
    per_cycle, isa = next(((n, f) for f, n in FP32_FLOPS_PER_CYCLE if f in flags), (2, "scalar"))
    note = f"{isa} fp32 FMA, 2 pipes" if isa != "scalar" else "no SIMD flags: scalar"
    if dtype == "float64":
        per_cycle, note = per_cycle // 2, note.replace("fp32", "fp64")
    elif dtype in ("bfloat16", "float16"):
        native = next(((n, f) for f, n in BF16_FLOPS_PER_CYCLE if f in flags), None) if dtype == "bfloat16" else None
        if native:
            per_cycle, note = native[0], f"{native[1]}"
        else:
            note += f"; no native {dtype}: the fp32 rate at best"
    tflops = cores * ghz * per_cycle / 1e3
    return tflops, f"{cores} cores x {ghz:.3g} GHz ({clock_source}) x {per_cycle} FLOP/cycle ({note})"


# --- the CPU's attainable peak, measured -----------------------------------------------

GEMM_SIZE = 1024  # big enough to be compute-bound on any CPU (halved, down to MIN_GEMM_SIZE, for a slow dtype)
MIN_GEMM_SIZE = 128
GEMM_REPEATS = 5  # timed runs of GEMM_SECONDS each; the best is the peak (the least disturbed)
GEMM_SECONDS = 0.4
STREAM_BYTES = 256 * 2**20  # each array of the bandwidth test: far beyond any last-level cache


def measure_cpu_peak(dtype: str, threads: int, size: int = GEMM_SIZE, repeats: int = GEMM_REPEATS,
                     seconds: float = GEMM_SECONDS) -> dict:
    """A square GEMM of ``size`` in ``dtype`` on ``threads`` intra-op threads, run
    ``repeats`` times for ``seconds`` each after a warm-up: the best run's TFLOP/s (the
    attainable peak), every run's, and the conditions."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=generator).to(getattr(torch, dtype))
        b = torch.randn(size, size, generator=generator).to(getattr(torch, dtype))
        out = torch.empty(size, size, dtype=a.dtype)
        torch.mm(a, b, out=out)  # warm-up: oneDNN's kernel selection, first touch
        while True:  # a size that fits the run
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            # A dtype the CPU emulates (bf16 on AVX2: many times slower) would take seconds a call.
            if time.perf_counter() - start < seconds / 2 or size <= MIN_GEMM_SIZE:
                break
            size //= 2
            a, b, out = a[:size, :size].contiguous(), b[:size, :size].contiguous(), out[:size, :size].contiguous()
        meter, runs = ContentionMeter(), []
        meter.start()
        for _ in range(repeats):
            calls, start = 0, time.perf_counter()
            while True:
                torch.mm(a, b, out=out)
                calls += 1
                elapsed = time.perf_counter() - start
                if elapsed >= seconds:
                    break
            runs.append(2 * size ** 3 * calls / elapsed / 1e12)
        contention = meter.stop()
    finally:
        torch.set_num_threads(before)
    return {"tflops": max(runs), "best": max(runs), "runs_tflops": runs, "dtype": dtype, "threads": threads, "gemm_size": size,
            "seconds_per_run": seconds, "torch": torch.__version__, "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "other_cpus": contention.other_cpus if contention else math.nan,
            "contended": bool(contention and contention.contended)}


# STREAM-style kernels over float32 arrays: what each does, and how many array sizes it
# counts as moved (each array read or written once, as STREAM counts). Counted bytes per
# second differ between them: a write costs a cache-line fill besides the write itself,
# uncounted, so a kernel that reads more than it writes reaches more. The roof is the best
# of them; copy alone, STREAM's usual figure, would put a plain vector add above its roof.
BANDWIDTH_KERNELS = {  # name -> (arrays counted, (torch, a, b, c) -> None)
    "read": (1, lambda torch, a, b, c: a.sum()),
    "copy": (2, lambda torch, a, b, c: c.copy_(a)),
    "add": (3, lambda torch, a, b, c: torch.add(a, b, out=c)),
}


def measure_cpu_bandwidth(threads: int, nbytes: int = STREAM_BYTES, repeats: int = GEMM_REPEATS) -> dict:
    """The STREAM-style kernels of BANDWIDTH_KERNELS over arrays of ``nbytes``, far beyond
    the caches, taken in turn ``repeats`` times (a change in the machine's speed hits each
    alike): the best run of any, in GB/s counted as each kernel counts its bytes."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.ones(nbytes // 4, dtype=torch.float32)
        b, c = torch.ones_like(a), torch.empty_like(a)
        runs: dict[str, list[float]] = {name: [] for name in BANDWIDTH_KERNELS}
        for _, kernel in BANDWIDTH_KERNELS.values():
            kernel(torch, a, b, c)  # warm-up: first touch of every page
        meter = ContentionMeter()
        meter.start()
        for _ in range(repeats):
            for name, (arrays, kernel) in BANDWIDTH_KERNELS.items():
                start = time.perf_counter()
                kernel(torch, a, b, c)
                runs[name].append(arrays * nbytes / (time.perf_counter() - start) / 1e9)
        contention = meter.stop()
    finally:
        torch.set_num_threads(before)
    best = max(max(values) for values in runs.values())
    return {"gb_s": best, "best": best, "runs_gb_s": runs, "threads": threads, "bytes": nbytes,
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "other_cpus": contention.other_cpus if contention else math.nan,
            "contended": bool(contention and contention.contended)}


def cache_file(name: str, environ: Optional[Mapping[str, str]] = None) -> str:
    """A file of this user's accelsweep cache: beside the compile cache's folder."""
    return os.path.join(os.path.dirname(default_root(environ)), name)


def _machine_key(cpuinfo: str, what: str) -> str:
    """This machine (its CPU, cores and ISA), torch's version and what was measured."""
    import torch

    model, flags = parse_cpuinfo(cpuinfo)
    identity = json.dumps([host.node(), model, os.cpu_count(), sorted(flags), torch.__version__, what])
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


@contextlib.contextmanager
def locked_json_cache(path: str):
    """The cache's contents, written back on exit; one process at a time on this machine,
    so that concurrent trials measure one after the other, not against each other."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as cached:
                entries = json.load(cached)
        except (OSError, ValueError):
            entries = {}
        before = json.dumps(entries, sort_keys=True)
        yield entries
        if json.dumps(entries, sort_keys=True) != before:
            temporary = f"{path}.{os.getpid()}"
            with open(temporary, "w") as out:
                json.dump(entries, out, indent=1, sort_keys=True)
            os.replace(temporary, path)


QUIET_PROBE_S = 0.3  # how long the machine is watched before a contended figure is measured again


def quiet_now(seconds: float = QUIET_PROBE_S) -> bool:
    """No other process takes this machine's cores over the next ``seconds``."""
    meter = ContentionMeter()
    meter.start()
    time.sleep(seconds)
    contention = meter.stop()
    return not (contention and contention.contended)


# A peak stands once this many quiet measurements, at least PEAK_SPACING_S apart, agree on
# its best. One moment is not enough: a shared VM's speed moves by 20-30% for minutes at a
# time, and a neighbour using a fifth of a core (below what the contention meter calls
# contended) can halve a two-thread GEMM whose threads wait for each other; a peak cached
# from such a moment understates every later utilisation figure, and a sweep's
# stop-at-utilisation goal is reached early. Each further moment costs one trial a
# measurement (about 2.5 s).
PEAK_MOMENTS = 3
PEAK_SPACING_S = 600.0


def _quiet_moments(kept: Optional[Mapping]) -> int:
    """The quiet measurements behind a cached figure (one written before they were
    counted: one, unless it was contended)."""
    if not kept:
        return 0
    return int(kept.get("quiet_moments", 0 if kept.get("contended") else 1))


def _settled(kept: Mapping, now: float) -> bool:
    """A quiet figure taken at enough moments, or measured too recently for another."""
    return (_quiet_moments(kept) >= PEAK_MOMENTS
            or now - float(kept.get("measured_epoch", 0.0)) < PEAK_SPACING_S)


def cached_measurement(what: str, measure, cpuinfo: str, cache: Optional[str] = None) -> tuple[dict, bool]:
    """``measure()``'s result for ``what`` on this machine: from the cache, or measured now
    and kept. A peak is the best the machine reaches, so the cache keeps the best figure
    seen, measured at PEAK_MOMENTS quiet moments before it stands. One taken while other
    processes held cores (``contended``) only understates it: it is measured again by the
    first caller that finds the machine quiet; so is a quiet one whose next moment is due
    (a busy machine costs its callers a QUIET_PROBE_S look, not a measurement). Returns the
    figure and whether it came from the cache."""
    path = cache or cache_file("peaks.json")
    key = _machine_key(cpuinfo, what)
    with locked_json_cache(path) as entries:
        kept, now = entries.get(key), time.time()
        if kept and ((not kept.get("contended") and _settled(kept, now)) or not quiet_now()):
            return kept, True
        figure = measure()
        moments = _quiet_moments(kept) + (0 if figure.get("contended") else 1)
        if kept and kept.get("best", 0) > figure.get("best", 0):
            # The faster figure stands, quiet once any run of it or after it was.
            figure = {**kept, "contended": bool(kept.get("contended") and figure.get("contended"))}
        figure.update(attempts=(kept or {}).get("attempts", 0) + 1, quiet_moments=moments, measured_epoch=now)
        entries[key] = figure
        return figure, False


def _read_cpuinfo() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as cpuinfo:
            return cpuinfo.read()
    return ""


def _contention_note(figure: Mapping) -> str:
    if not figure.get("contended"):
        return ""
    return (f"; other processes held {figure.get('other_cpus', math.nan):.1f} core(s) meanwhile, so it may "
            f"understate the peak")


def cpu_peak(dtype: str, threads: int, cpuinfo: Optional[str] = None, cache: Optional[str] = None) -> Peak:
    """This CPU's attainable peak for ``dtype`` on ``threads`` cores (measured here, cached),
    with the theoretical one beside it."""
    cpuinfo = _read_cpuinfo() if cpuinfo is None else cpuinfo
    figure, cached = cached_measurement(f"gemm {dtype} {threads} threads {GEMM_SIZE}",
                                        lambda: measure_cpu_peak(dtype, threads), cpuinfo, cache)
    theoretical, theory = cpu_theoretical_peak(cpuinfo, threads, dtype)
    runs = ", ".join(f"{r:.3g}" for r in figure["runs_tflops"])
    basis = (f"measured here: {dtype} GEMM {figure['gemm_size']}x{figure['gemm_size']} on {threads} thread(s), "
             f"best of {len(figure['runs_tflops'])} runs ({runs} TFLOP/s), torch {figure['torch']}, "
             f"{figure['measured_at']}{' (cached)' if cached else ''}" + _contention_note(figure))
    return Peak(figure["tflops"], dtype, basis, measured=True, theoretical_tflops=theoretical,
                theoretical_basis=f"theoretical: {theory}", conditions=figure)


def cpu_bandwidth(threads: int, cpuinfo: Optional[str] = None, cache: Optional[str] = None) -> tuple[float, str]:
    """This CPU's attainable memory bandwidth in GB/s (the best of STREAM-style read, copy and
    add, measured here, cached), and how it was found."""
    cpuinfo = _read_cpuinfo() if cpuinfo is None else cpuinfo
    figure, cached = cached_measurement(f"stream {'/'.join(BANDWIDTH_KERNELS)} {threads} threads {STREAM_BYTES}",
                                        lambda: measure_cpu_bandwidth(threads), cpuinfo, cache)
    runs = figure["runs_gb_s"]
    kernels = ", ".join(f"{name} {max(runs[name]):.3g}" for name in BANDWIDTH_KERNELS)
    repeats = len(runs["copy"])
    return figure["gb_s"], (f"measured here: the best of STREAM-style {kernels} GB/s (each the best of {repeats}) "
                            f"over {figure['bytes'] // 2**20} MiB float32 arrays on {threads} thread(s), "
                            f"{figure['measured_at']}{' (cached)' if cached else ''}" + _contention_note(figure))


def peak_for(platform: str, precision: str, devices: int = 1, threads: int = 1,
             device_name: str = "", cache: Optional[str] = None) -> Peak:
    """The peak a trial on ``platform`` in ``precision`` is held against: on a CPU, the one
    measured on its ``threads`` cores; elsewhere the datasheet's for ``device_name`` times
    ``devices`` (NaN, with the reason, for a device the table lacks)."""
    dtype = precision_dtype(precision)
    if platform == "cpu":
        return cpu_peak(dtype, threads, cache=cache)
    sheet = datasheet_peak(device_name or platform)
    if sheet is None or dtype not in sheet.tflops:
        known = ", ".join(d.device for d in DATASHEET.values())
        return Peak(math.nan, dtype, f"no datasheet {dtype} peak for {device_name or platform!r} (known: {known})",
                    measured=False)
    per_device = sheet.tflops[dtype]
    note = f"; {sheet.note}" if sheet.note else ""
    return Peak(per_device * devices, dtype,
                f"datasheet (not measured here): {devices} x {sheet.device} at {per_device:g} {dtype} TFLOP/s dense, "
                f"from the {sheet.source}{note}", measured=False, theoretical_tflops=per_device * devices,
                theoretical_basis="the datasheet's", bandwidth_gb_s=sheet.bandwidth_gb_s * devices,
                bandwidth_basis=f"datasheet: {sheet.bandwidth_gb_s:g} GB/s per {sheet.device}")
