"""The host CPU: eager PyTorch or torch.compile (inductor, max-autotune); intra-op
threads, channels_last, the memory allocator and NUMA binding as knobs.

The allocator is a library preloaded into the trial's process (``LD_PRELOAD``, as
PyTorch's ``torch.backends.xeon.run_cpu`` does), so it is there only in a process that
was started with it: ``trial_env`` gives the variables, the process that starts the
trial must put them in the new process's environment, and ``device`` refuses to train
in a process whose allocator is not the one asked for (what is loaded is read from
/proc/self/maps), so no trial is timed with the wrong one.
"""

from __future__ import annotations

import ctypes
import gc
import glob
import importlib.util
import math
import os
import platform as host
import sys
import sysconfig
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from accelsweep.trainables.cost import PRICE_TABLE
from accelsweep.trainables.errors import ConfigError, boolean, one_of, positive_int
from accelsweep.trainables.platforms.base import (Detection, Platform, PlatformKnobs, PlatformUnavailable,
                                                  TrainingStudy, channels_last_format)
from accelsweep.trainables.platforms.capabilities import Capabilities, emulated_bf16, not_known
from accelsweep.trainables.platforms.cpu_threads import ThreadFit

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return host.processor() or host.machine()


# A CPU with one of these multiplies bf16 in hardware: x86's AVX512-BF16 and AMX-BF16,
# Arm's BF16 extension. Without one, bf16 math is emulated through fp32 conversions, many
# times slower than fp32.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# The ISA flags a capability report lists (besides every amx_* present), by their names
# in /proc/cpuinfo: x86 "flags", Arm "Features".
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "bf16", "sve")
CPUINFO = "/proc/cpuinfo"
# oneDNN (PyTorch's CPU library for matmuls and convolutions) uses no instruction set above
# ONEDNN_MAX_CPU_ISA (oneDNN's dev guide, "CPU Dispatcher Control"; DNNL_ was its old
# prefix). These caps are below its first bf16 set (AVX2_VNNI_2 / AVX512_CORE_BF16): under
# them bf16 runs through fp32 conversions whatever /proc/cpuinfo says.
ONEDNN_CAPS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    """The model name ('' where none is given, as on many Arm CPUs) and the ISA flags of a
    /proc/cpuinfo text."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, Arm
            flags |= set(value.split())
        elif key.strip() == "model name" and not model:
            model = value.strip()
    return model, flags


def cpu_capabilities(cpuinfo: str, cores: int, numa_node_count: int,
                     source: str = f"{CPUINFO} of this machine", onednn_max_isa: Optional[str] = None) -> Capabilities:
    """What a CPU does natively, from its /proc/cpuinfo text: bf16 precisions are
    emulated unless it has one of BF16_FLAGS, and oneDNN is not capped below them
    (``onednn_max_isa``: the value of ONEDNN_MAX_CPU_ISA, if set)."""
    model, flags = parse_cpuinfo(cpuinfo)
    reported = list(REPORTED_FLAGS) + sorted(flag for flag in flags if flag.startswith("amx_"))
    present = [flag for flag in reported if flag in flags]
    bf16_native = any(flag in flags for flag in BF16_FLAGS)
    facts = {"model": model, "cores": cores, "numa_nodes": numa_node_count, "bf16_native": bf16_native,
             **{flag: flag in flags for flag in reported}}
    hardware = f"{model or 'CPU'}, {cores} cores, {numa_node_count} NUMA node(s); {' '.join(present) or 'no AVX2'}"
    capped = (onednn_max_isa or "").upper() in ONEDNN_CAPS_WITHOUT_BF16
    if onednn_max_isa:
        facts["onednn_max_cpu_isa"] = onednn_max_isa
        hardware += f"; oneDNN capped at {onednn_max_isa}"
    if bf16_native and not capped:
        return Capabilities(hardware, source, facts, read_here=True)
    if bf16_native:
        return Capabilities(hardware, source, facts, read_here=True, emulated=emulated_bf16(
            f"ONEDNN_MAX_CPU_ISA={onednn_max_isa} keeps oneDNN below its bf16 instructions (AVX512_CORE_BF16): "
            "bf16 runs through fp32 conversions"))
    if "asimd" in flags:  # every AArch64 CPU lists asimd: an Arm CPU
        missing = f"no bf16 in {CPUINFO}'s Features"
    else:
        missing = f"neither avx512_bf16 nor amx_bf16 in {CPUINFO}"
    this_cpu = f"this CPU ({model})" if model else "this CPU"
    return Capabilities(hardware, source, facts, emulated_bf16(f"no native bf16 on {this_cpu}: {missing}"),
                        read_here=True)


_libraries_frozen = False


def _runs_only_trials() -> bool:
    """A Ray worker process (a Tune trial's actor): what is alive in it besides the trial is
    the libraries' and Ray's. Not a driver, a notebook or a test process, whose own objects
    are alive beside the trial's."""
    ray_worker = sys.modules.get("ray._private.worker")
    return ray_worker is not None and getattr(ray_worker.global_worker, "mode", None) == ray_worker.WORKER_MODE


def _collect_trial_garbage() -> None:
    """Free an earlier trial's objects held in reference cycles, walking the libraries'
    objects once per trial process. With torch, timm and Ray imported a process holds about
    half a million objects; a full collection walks them all: 0.25 s here, 0.4-0.75 s in a
    process forked from one that imported them (the walk writes to every object, so the
    child copies every page it shares). In a trial process the first collection is followed
    by gc.freeze(): what is left (the libraries' modules and state) is out of every later
    collection, the automatic ones during timed windows included, and a later trial's (Tune
    reusing the process) walks only what came after. Elsewhere nothing is frozen: a frozen
    object that later becomes garbage in a cycle is never freed, and a notebook's or a
    test's own objects are alive there too."""
    global _libraries_frozen
    gc.collect()
    if not _libraries_frozen and _runs_only_trials():
        gc.freeze()
        _libraries_frozen = True


def _trim_c_heap() -> None:
    """glibc's malloc_trim(0): free heap pages go back to the OS (absent elsewhere: no-op)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def _read_status_mb(field: str) -> float:
    """A memory figure of /proc/self/status (VmHWM: peak RSS, VmRSS: RSS now), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


# The allocators the ``allocator`` knob offers besides glibc's malloc (every process's),
# by the file names of their libraries: those run_cpu preloads (gperftools' tcmalloc,
# jemalloc; tcmalloc_minimal is tcmalloc without the heap profiler).
ALLOCATOR_LIBRARIES = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so", "libtcmalloc_minimal.so"),
}
ALLOCATORS = ("glibc",) + tuple(ALLOCATOR_LIBRARIES)
# jemalloc's settings under run_cpu (torch/backends/xeon/run_cpu.py), which the seed ran.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"
ALLOCATOR_INSTALL_HINT = ("jemalloc: Ray's wheel ships one (ray/core/libjemalloc.so), or apt-get install libjemalloc2; "
                          "tcmalloc: apt-get install libtcmalloc-minimal4 (or google-perftools), or conda install "
                          "-c conda-forge gperftools")


def allocator_search_path() -> list[str]:
    """Where allocator libraries are looked for, in order: run_cpu's places (the conda
    env, the venv, ~/.local/lib, /usr/local, /usr), the system's multiarch directory,
    then the package that ships one (Ray's wheel bundles jemalloc in ray/core)."""
    places = [os.path.join(os.environ[var], "lib") for var in ("CONDA_PREFIX", "VIRTUAL_ENV") if var in os.environ]
    places.append(os.path.join(sys.prefix, "lib"))
    places.append(os.path.expanduser("~/.local/lib"))
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for prefix in ("/usr/local", "/usr", ""):
        places += [f"{prefix}/lib64", f"{prefix}/lib"] + ([f"{prefix}/lib/{multiarch}"] if multiarch else [])
    ray = importlib.util.find_spec("ray")  # finds the package without importing it
    if ray is not None and ray.submodule_search_locations:
        places += [os.path.join(location, "core") for location in ray.submodule_search_locations]
    return list(dict.fromkeys(place for place in places if os.path.isdir(place)))


def find_allocator(name: str) -> Optional[str]:
    """The path of allocator ``name``'s library on this machine, None if none is found
    (glibc's malloc is in every process: its path is '')."""
    if name == "glibc":
        return ""
    for place in allocator_search_path():
        for library in ALLOCATOR_LIBRARIES[name]:
            path = os.path.join(place, library)
            if os.path.isfile(path):
                return os.path.realpath(path)
    return None


def available_allocators() -> dict[str, str]:
    """The allocators this machine has: name -> library path ('' for glibc)."""
    found = {name: find_allocator(name) for name in ALLOCATORS}
    return {name: path for name, path in found.items() if path is not None}


def loaded_allocators(maps: str = "/proc/self/maps") -> dict[str, str]:
    """The allocator libraries mapped into this process (name -> path), read from its
    memory map: what really runs, whatever the environment says."""
    loaded: dict[str, str] = {}
    try:
        with open(maps) as mapped:
            paths = {line.split()[-1] for line in mapped if "/" in line}
    except OSError:
        return loaded
    for path in sorted(paths):
        for name, libraries in ALLOCATOR_LIBRARIES.items():
            stems = {library.split(".so")[0] + ".so" for library in libraries}  # any version: libjemalloc.so.2.1
            if os.path.basename(path).startswith(tuple(stems)):
                loaded.setdefault(name, path)
    return loaded


def numa_nodes(root: str = "/sys/devices/system/node") -> dict[int, list[int]]:
    """This machine's NUMA nodes and their CPUs (node -> CPU ids), from sysfs; one node
    holding every CPU where sysfs says nothing."""
    nodes: dict[int, list[int]] = {}
    for path in sorted(glob.glob(os.path.join(root, "node[0-9]*", "cpulist"))):
        with open(path) as cpulist:
            cpus = parse_cpulist(cpulist.read())
        if cpus:
            nodes[int(os.path.basename(os.path.dirname(path))[4:])] = cpus
    return nodes or {0: sorted(os.sched_getaffinity(0))}


def parse_cpulist(text: str) -> list[int]:
    """A kernel CPU list ("0-3,8-11") as CPU ids."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus += range(int(first), int(last or first) + 1)
    return cpus


@dataclass(frozen=True)
class CpuKnobs(PlatformKnobs):
    # Intra-op threads (torch.set_num_threads, set per trial); None: cpus_per_worker.
    threads: Optional[int] = None
    # Model weights and inputs in channels_last (NHWC) memory format: faster convolutions
    # with oneDNN on many CPUs (the CPU post's knob).
    channels_last: bool = False
    # The memory allocator the trial process runs with: "glibc" (malloc as it is),
    # "jemalloc" or "tcmalloc" (preloaded, run_cpu's way: LD_PRELOAD at process start).
    # None: whatever the process has, unchecked. A set value is checked in the trial
    # against the libraries its process has mapped.
    allocator: Optional[str] = None
    # Pin each data-parallel worker's threads to the CPUs of one NUMA node (worker rank
    # r on node r mod nodes), so that its memory is node-local (Linux allocates on the
    # node of the CPU that first touches a page): the seed's NUMA DDP (ipexrun binds so).
    numa_bind: bool = False

    def __post_init__(self) -> None:
        if self.threads is not None:
            positive_int("threads", self.threads)
        boolean("channels_last", self.channels_last)
        if self.allocator is not None:
            one_of("allocator", self.allocator, ALLOCATORS)
        boolean("numa_bind", self.numa_bind)

    def process_env(self) -> dict[str, str]:
        """The variables a trial process must be started with for these knobs (read by
        the dynamic loader at exec: setting them later changes nothing)."""
        if self.allocator in (None, "glibc"):
            return {}
        path = find_allocator(self.allocator)
        if path is None:
            raise ConfigError("allocator", f"one of {', '.join(available_allocators())} (found on this machine)",
                              self.allocator, f"No {' or '.join(ALLOCATOR_LIBRARIES[self.allocator])} in "
                              f"{', '.join(allocator_search_path())}. {ALLOCATOR_INSTALL_HINT}.")
        env = {"LD_PRELOAD": path}
        if self.allocator == "jemalloc":
            env["MALLOC_CONF"] = JEMALLOC_CONF
        return env


class CpuPlatform(Platform):
    name = "cpu"
    description = "host CPU, eager or torch.compile (inductor)"
    precisions = ("fp32", "bf16-autocast", "bf16")
    compile_modes = ("none", "inductor", "max-autotune")
    Knobs = CpuKnobs
    autocast_device_type = "cpu"
    cost_unit = "CPU"
    host_clock_times_steps = True  # CPU kernels run synchronously on the calling thread
    jax_backend = "cpu"
    sized_for_cpu = True
    trial_owns_cpus = True  # intra-op threads on every core it holds
    host_read_cost = "nothing: CPU ops have finished when they return, so nothing waits for a device"
    study_batch_sizes = (8, 16, 32, 64)

    def detect(self) -> Detection:
        return Detection(True, f"{os.cpu_count()} logical CPUs ({cpu_model_name()})")

    def capabilities(self, config) -> Capabilities:
        try:
            with open(CPUINFO) as cpuinfo:
                text = cpuinfo.read()
        except OSError as error:
            return not_known(cpu_model_name(), f"{CPUINFO} cannot be read ({error})")
        cap = next((os.environ[name] for name in ONEDNN_ISA_VARIABLES if os.environ.get(name)), None)
        return cpu_capabilities(text, cores=len(os.sched_getaffinity(0)), numa_node_count=len(numa_nodes()),
                                onednn_max_isa=cap)

    def validate(self, config: "TrialConfig") -> None:
        super().validate(config)
        threads = config.knobs.threads
        if threads is not None and threads > config.cpus_per_worker:
            raise ConfigError("threads", f"<= cpus_per_worker ({config.cpus_per_worker})", threads,
                              "More intra-op threads than CPUs held only oversubscribes the cores.")
        config.knobs.process_env()  # an allocator this machine lacks is refused here, before any trial

    def trial_env(self, config: "TrialConfig") -> dict[str, str]:
        return {**config.knobs.process_env(), **self.compile_cache_env(config)}

    def first_guess(self, config: "TrialConfig", choices: Mapping[str, Sequence[Any]],
                    capabilities: Capabilities) -> dict[str, tuple[Any, str]]:
        """The CPU rules of thumb, each from this trial's resources or this CPU's flags:
        bf16 where the CPU has bf16 instructions (fp32 where it only emulates them), a
        compute thread on every CPU the trial holds, then no loader process beside them,
        the largest batch, channels_last. Knobs without a rule keep the baseline's value."""
        guess: dict[str, tuple[Any, str]] = {}
        cores = config.cpus_per_worker
        precisions = choices.get("precision", ())
        if capabilities.known and precisions:
            emulated = capabilities.emulated.get("precision", {})
            if "bf16" in precisions and "bf16" not in emulated:
                flag = next((name for name in BF16_FLAGS if capabilities.facts.get(name)), "bf16")
                guess["precision"] = ("bf16", f"{flag}: this CPU multiplies bf16 natively, twice fp32's "
                                              "operations per instruction on half the bytes")
            elif "fp32" in precisions and "bf16" in emulated:
                guess["precision"] = ("fp32", f"bf16 is only emulated here ({emulated['bf16']})")
        fitting = [n for n in choices.get("threads", ()) if isinstance(n, int) and n <= cores]
        if fitting:
            guess["threads"] = (max(fitting), f"a compute thread on each of the {cores} CPU(s) a trial holds")
        threads = guess["threads"][0] if "threads" in guess else self.threads(config)
        if 0 in choices.get("num_workers", ()) and threads >= cores:
            guess["num_workers"] = (0, f"a loader process would take CPU time from the {threads} compute "
                                       f"thread(s) on the trial's {cores} CPU(s)")
        sizes = [size for size in choices.get("batch_size", ()) if isinstance(size, int)]
        if sizes:
            guess["batch_size"] = (max(sizes), "the largest batch spreads each step's fixed cost (the optimizer "
                                               "step, Python's dispatch) over the most samples")
        if True in choices.get("channels_last", ()):
            guess["channels_last"] = (True, "oneDNN runs convolutions in NHWC without converting the layout")
        return guess

    def trial_cpus(self, cpus: int) -> dict[str, Any]:
        owned = super().trial_cpus(cpus)
        if self.trial_owns_cpus:  # a compute thread on each
            owned["threads"] = cpus
        return owned

    def study_model(self, study: TrainingStudy) -> dict[str, Any]:
        """A ViT a CPU steps in a fraction of a second, over windows of seconds."""
        if study.smoke:
            return super().study_model(study)
        return dict(model="vit-tiny", warmup_steps=3, window_min_steps=5, window_min_s=2.0, windows=3)

    def study_space(self, trial: Any, precision: str, study: TrainingStudy) -> Optional[dict[str, Any]]:
        """The CPU post's knobs: intra-op threads, channels_last and, but in a smoke run (an
        inductor compile takes tens of seconds on 2 cores), torch.compile. Where node types are
        searched, a trial owns the node it draws: its CPUs, as threads."""
        if study.instance_types:
            node = PRICE_TABLE[trial.suggest_categorical("instance_type", list(study.instance_types))]
            return self.trial_cpus(node.vcpus)
        trial.suggest_categorical("threads", sorted({1, max(1, study.cpus // 2), study.cpus}))
        trial.suggest_categorical("channels_last", [False, True])
        if not study.smoke:
            trial.suggest_categorical("torch_compile", ["none", "inductor"])
        return None

    def ordered_knobs(self, config: "TrialConfig") -> dict[str, tuple[str, Optional[int]]]:
        """The batch, doubled; loader workers and intra-op threads one more, up to the CPUs
        a trial holds (past them they only take turns on the same cores)."""
        return {**super().ordered_knobs(config), "num_workers": ("+1", config.cpus_per_worker),
                "threads": ("+1", config.cpus_per_worker)}

    def memory_capacity_mb(self, device: "torch.device") -> float:
        """The memory a trial's peak RSS is measured against: the host's (MemTotal), or the
        container's limit where that is lower (cgroup v2 memory.max)."""
        total = float("nan")
        try:
            with open("/proc/meminfo") as meminfo:
                total = next(int(line.split()[1]) / 1024 for line in meminfo if line.startswith("MemTotal:"))
        except (OSError, ValueError, IndexError, StopIteration):
            pass
        try:
            with open("/sys/fs/cgroup/memory.max") as limit:
                text = limit.read().strip()
            if text.isdigit():
                total = min(total, int(text) / 2**20) if math.isfinite(total) else int(text) / 2**20
        except OSError:
            pass
        return total

    def thread_fit(self, config: "TrialConfig", measure: bool = True) -> ThreadFit:
        return ThreadFit(asked=self.threads(config), measure=measure).start()

    def threads(self, config: "TrialConfig") -> int:
        """The intra-op threads a trial asks for: the knob, else every CPU it holds (fewer
        run while other processes keep cores busy: ``thread_fit``)."""
        threads = config.knobs.threads
        return threads if threads is not None else config.cpus_per_worker

    def memory_format(self, config: "TrialConfig") -> "torch.memory_format":
        return channels_last_format(config.knobs.channels_last)

    def device(self, config: "TrialConfig") -> "torch.device":
        import torch

        self.check_allocator(config)
        if config.knobs.numa_bind:
            self.bind_to_numa_node()
        # Set per trial: a reused trial process keeps whatever the last trial chose.
        torch.set_num_threads(self.threads(config))
        return self.torch_device()

    def check_allocator(self, config: "TrialConfig", maps: str = "/proc/self/maps") -> None:
        """Refuse to train in a process whose allocator is not the config's: the library
        is preloaded when a process starts, so a reused process keeps the one it began with."""
        wanted = config.knobs.allocator
        if wanted is None:
            return
        loaded = loaded_allocators(maps)
        has = ", ".join(f"{name} ({path})" for name, path in loaded.items()) or "glibc's malloc only"
        if (wanted == "glibc" and loaded) or (wanted != "glibc" and wanted not in loaded):
            raise PlatformUnavailable(
                f"allocator {wanted!r} was asked for, but this process has {has} (it was started with "
                f"LD_PRELOAD={_start_environment().get('LD_PRELOAD', '')!r}). The dynamic loader reads LD_PRELOAD "
                f"only when a process starts: start the trial's process with "
                f"{self.trial_env(config) or 'no LD_PRELOAD'} (sweeps/cpu_resnet.py runs each trial in a fresh "
                "process so), not a reused one.")

    def bind_to_numa_node(self) -> None:
        """Pin this process to the CPUs of NUMA node (data-parallel rank mod nodes)."""
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        nodes = numa_nodes()
        node = sorted(nodes)[rank % len(nodes)]
        os.sched_setaffinity(0, nodes[node])

    def torch_device(self) -> "torch.device":
        import torch

        return torch.device("cpu")

    def sync(self, device: "torch.device") -> None:
        pass  # nothing is queued: CPU ops have finished when they return

    def reset_peak_memory(self, device: "torch.device") -> None:
        # An earlier trial's memory, freed but kept by the C allocator, is still resident:
        # the next trial would reuse it without RSS growing (workload memory 0). Give it
        # back to the OS first (glibc's malloc_trim), so RSS is what is live.
        _collect_trial_garbage()
        _trim_c_heap()
        # Linux: writing 5 to clear_refs resets VmHWM (peak RSS) for this process, so a
        # reused trial process reports this trial's peak, not an earlier trial's. Where it
        # cannot (a sandbox without clear_refs), the peak is the process's lifetime one.
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
            self._peak_was_reset = True
        except OSError:
            self._peak_was_reset = False

    def peak_memory_mb(self, device: "torch.device") -> float:
        # The process's peak RSS: torch, Ray and the interpreter (hundreds of MB) included;
        # workload_memory_mb is the part above what the process held before the workload.
        try:
            return _read_status_mb("VmHWM")
        except OSError:
            return float("nan")

    def memory_in_use_mb(self, device: "torch.device") -> float:
        if not getattr(self, "_peak_was_reset", False):
            return float("nan")  # a peak that may be an earlier trial's: no workload figure
        try:
            return _read_status_mb("VmRSS")
        except OSError:
            return float("nan")

    def describe_device(self, device: "torch.device") -> str:
        import torch

        allocator = ", ".join(f"{name} {path}" for name, path in loaded_allocators().items()) or "glibc"
        return (f"cpu: {cpu_model_name()}, {torch.get_num_threads()} intra-op threads, allocator {allocator}, "
                f"CPUs {_cpu_ranges(sorted(os.sched_getaffinity(0)))}")


def _start_environment() -> dict[str, str]:
    """The environment this process was started with (what its dynamic loader read)."""
    try:
        with open("/proc/self/environ", "rb") as environ:
            entries = environ.read().split(b"\0")
    except OSError:
        return {}
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in entries if b"=" in entry)


def _cpu_ranges(cpus: list[int]) -> str:
    """CPU ids as the kernel writes them: "0-3,8"."""
    ranges: list[list[int]] = []
    for cpu in cpus:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in ranges)
