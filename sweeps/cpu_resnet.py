"""Seed 003's CPU post as a sweep: ResNet training throughput on the host CPU, knob by knob.

    python sweeps/cpu_resnet.py                       # local default: ResNet-18 at 64x64, under 10 min on 2 cores
    python sweeps/cpu_resnet.py --smoke               # CI: ResNet-18 at 32x32, 4 short trials
    python sweeps/cpu_resnet.py --full --instance-type c7i.2xlarge          # the seed's ResNet-50 at 224, batch 128
    python sweeps/cpu_resnet.py --full --instance-type c7i.2xlarge --spot   # priced at the seed's spot quote
    python sweeps/cpu_resnet.py --dry-run             # the space, each trial's environment (LD_PRELOAD)

The seed's hand-run table (c7i.2xlarge: 8 vCPUs, Sapphire Rapids; PyTorch 2.4; torchvision
ResNet-50 at 224x224, SGD, random images; the seed's figures, not measured here):

    experiment                  knob here                               seed's samples/s
    baseline                    batch 128, num_workers=0, fp32          9.12
    batch size                  batch_size                              (a chart: smaller was faster)
    multi-process loading       num_workers                             (a chart)
    bf16 autocast               precision=bf16-autocast                 24.34   (+86%)
    channels_last               channels_last=True                      37.93   (+56%)
    torch.compile               torch_compile=inductor | max-autotune   +27% without channels_last, slower with it
    run_cpu (tcmalloc, iomp5)   allocator=tcmalloc | jemalloc           39.05
    ipex.optimize(bf16)         (none: see below)                       40.73
    DDP across NUMA nodes       workers=2, numa_bind (c6i.32xlarge)     no gain
    price                       --instance-type c7i.2xlarge [--spot]    $0.357/h on demand, $0.1291/h spot

At 40.73 samples/s those prices are $2.43 per million samples on demand and $0.88 at spot
(the seed's "1135.76" samples per dollar, in thousands). Each knob here:

- ``batch_size``, ``num_workers`` (DataLoader processes, which share the cores with training).
- ``precision=bf16-autocast``: offered, and accepted, only where the CPU does bf16 in hardware
  (AVX512-BF16 or AMX-BF16 on x86, BF16 on Arm, from /proc/cpuinfo); elsewhere torch would
  emulate it, which is not the seed's experiment (``CpuResNet.validate`` says so).
- ``channels_last``, ``threads`` (torch.set_num_threads per trial).
- ``torch_compile``: ``inductor``, or ``max-autotune`` (inductor with mode="max-autotune").
- ``allocator``: glibc's malloc, or jemalloc/tcmalloc preloaded as run_cpu does (LD_PRELOAD,
  jemalloc with run_cpu's MALLOC_CONF). Only those found on the machine are searched; looked
  for in run_cpu's places ($CONDA_PREFIX/lib, $VIRTUAL_ENV/lib, ~/.local/lib, /usr/local,
  /usr), the system's multiarch directory, and Ray's wheel, which ships jemalloc
  (ray/core/libjemalloc.so: the jemalloc found here). A preloaded library is there only in a
  process started with it, so every trial runs in a fresh process of its own started with
  its environment (``fresh_process_trainable``), and the trial refuses to train if its
  process's memory map does not hold the allocator asked for (``device`` names the one used).
- ``workers`` across NUMA nodes: searched only on a machine with more than one node (one
  worker per node, each pinned to its node's CPUs: ``numa_bind``; Ray Train, gloo), with
  glibc's allocator (Ray Train's worker processes are Ray's, started without LD_PRELOAD).
- Not knobs here: Intel's OpenMP (run_cpu's libiomp5; the intel-openmp wheel is not installed
  in this project), ipex.optimize and oneCCL (intel-extension-for-pytorch's last release,
  2.8.0, pairs with torch 2.8; this project runs torch 2.14), torch-xla on the CPU.

It is a CPU study: ``--platform cuda`` (or any other) is refused, and ``--dry-run`` says so.
What was verified where: everything above ran here, on a 2-core AMD EPYC (Zen 4: AVX512-BF16,
one NUMA node) with Ray's jemalloc; tcmalloc, several NUMA nodes and the seed's c7i never did.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from dataclasses import dataclass
from typing import Any

from accelsweep import Objective, Sweep, plan_sweep, run_sweep
from accelsweep.sweeps.driver.define.cli import common_parser, cost_basis, main_guard, platform_from_args, sweep_options
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.fresh_process import fresh_process_trainable
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, import_path, knob

DEFAULT_SAMPLES = 16
CPU_TIME_BUDGET_S = 420  # stops starting trials in time for the default run to end within 10 minutes on 2 cores
SEED_INSTANCE = "c7i.2xlarge"
# The seed's spot quote (c7i.2xlarge, seed 003's CPU post); spot prices move by the hour.
SEED_SPOT_USD_PER_HOUR = {SEED_INSTANCE: 0.1291}
ALLOCATORS = ("glibc", "jemalloc", "tcmalloc")  # run_cpu's choices
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX512-BF16, AMX-BF16; Arm's BF16 extension


# ---- the workload: the seed's script -----------------------------------------------------------------
class RandomImages:
    """The seed's FakeDataset: a fresh randn image per item (so DataLoader workers have work
    to overlap), label index % 10; seeded per index, and worker ``rank`` sees its own shard."""

    def __init__(self, size: int, seed: int, rank: int, world_size: int):
        self.size, self.seed, self.rank, self.world_size = size, seed, rank, world_size

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int):
        import torch

        index = index * self.world_size + self.rank
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return torch.randn(3, self.size, self.size, generator=generator), index % 10


class CpuResNet(Workload):
    """A torchvision ResNet (1000 classes) trained with SGD at ``learning_rate``, as in the seed."""

    imports = ("torchvision",)

    @dataclass(frozen=True)
    class Knobs(WorkloadKnobs):
        model: str = knob("resnet50", choices=("resnet18", "resnet34", "resnet50"))
        image_size: int = knob(224, choices=(32, 64, 112, 224))

    def validate(self, config) -> None:
        if config.platform == "cpu" and config.precision != "fp32":
            native, reason = native_bf16()
            if not native:
                raise ConfigError("precision", "fp32 on this CPU", config.precision,
                                  f"{reason}: torch would emulate bf16, not the seed's experiment (its c7i has "
                                  "AMX-BF16). This study runs bf16 only where the CPU does it in hardware.")

    def build_model(self, config):
        import torchvision

        return getattr(torchvision.models, config.workload_knobs.model)()

    def dataset(self, config, rank: int, world_size: int):
        return RandomImages(config.workload_knobs.image_size, config.seed, rank, world_size)

    def optimizer(self, parameters, config):
        import torch

        return torch.optim.SGD(parameters, lr=config.learning_rate)


def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> tuple[bool, str]:
    """Whether this CPU does bf16 arithmetic in hardware, and a sentence saying why."""
    flags, model = set(), "this CPU"
    try:
        with open(cpuinfo) as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):  # x86, Arm
                    flags |= set(value.split())
                elif key.strip() == "model name":
                    model = value.strip()
    except OSError as error:
        return False, f"{cpuinfo} cannot be read ({error})"
    found = [flag for flag in BF16_FLAGS if flag in flags]
    if found:
        return True, f"{model} has {', '.join(found)}"
    return False, f"{model} has none of {', '.join(BF16_FLAGS)} in {cpuinfo}"


def numa_node_count(root: str = "/sys/devices/system/node") -> int:
    """NUMA nodes with CPUs (a memory-only node, CXL say, runs no worker)."""
    def has_cpus(node: str) -> bool:
        try:
            with open(os.path.join(node, "cpulist")) as cpulist:
                return bool(cpulist.read().strip())
        except OSError:
            return False

    return max(1, sum(has_cpus(node) for node in glob.glob(os.path.join(root, "node[0-9]*"))))


def allocators_here(platform: str) -> list[str]:
    """The allocators a trial can get on this machine: those a config accepts (the platform
    looks for each library and refuses one it cannot find)."""
    found = []
    for name in ALLOCATORS:
        try:
            TrialConfig.make(platform=platform, workload=import_path(CpuResNet), allocator=name)
        except ConfigError:
            continue
        found.append(name)
    return found


# ---- the sweep -----------------------------------------------------------------------------------------
def presets(args) -> dict[str, Any]:
    """Model, image size, baseline batch and measurement of each run size."""
    if args.full:  # the seed's script: 10 steps skipped, 100 timed
        size = dict(model="resnet50", image_size=224, batch_size=128, warmup_steps=10, window_min_steps=30,
                    window_min_s=30.0, windows=3)
    elif args.smoke:
        size = dict(model="resnet18", image_size=32, batch_size=8, warmup_steps=2, window_min_steps=3,
                    window_min_s=0.25, windows=2)
    else:
        size = dict(model="resnet18", image_size=64, batch_size=32, warmup_steps=2, window_min_steps=3,
                    window_min_s=2.0, windows=3)
    return {**size, **{key: value for key, value in (("model", args.model), ("image_size", args.image_size))
                       if value is not None}}


def make_space(smoke: bool, full: bool, cpus: int, bf16: bool, allocators: list[str], nodes: int):
    batch_sizes = [4, 8, 16] if smoke else [32, 64, 128] if full else [16, 32, 64]

    def space(trial):
        trial.suggest_categorical("batch_size", batch_sizes)
        trial.suggest_categorical("num_workers", [0, 1] if smoke else [0, 1, 2])
        trial.suggest_categorical("precision", ["fp32", "bf16-autocast"] if bf16 else ["fp32"])
        trial.suggest_categorical("channels_last", [False, True])
        if not smoke:  # inductor compiles a ResNet for a minute or more on 2 cores: not in CI's run
            trial.suggest_categorical("torch_compile", ["none", "inductor", "max-autotune"])
        if nodes > 1 and not smoke and trial.suggest_categorical("workers", [1, nodes]) > 1:
            # One worker per NUMA node, pinned there; Ray Train's processes have glibc's malloc.
            per_node = cpus // nodes
            return {"cpus_per_worker": per_node, "threads": per_node, "numa_bind": True, "allocator": "glibc"}
        trial.suggest_categorical("threads", sorted({1, max(1, cpus // 2), cpus}))
        trial.suggest_categorical("allocator", allocators)
        return None

    return space


def main():
    parser = common_parser(__doc__.split("\n\n")[0], DEFAULT_SAMPLES)
    parser.add_argument("--full", action="store_true",
                        help="the seed's workload: ResNet-50 at 224x224, baseline batch 128 (hours on 2 cores)")
    parser.add_argument("--model", choices=CpuResNet.Knobs.__dataclass_fields__["model"].metadata["choices"],
                        default=None, help="the ResNet (default: resnet18; --full: resnet50)")
    parser.add_argument("--image-size", type=int, default=None, help="image side (default: 64; --smoke: 32; "
                                                                     "--full: 224)")
    parser.add_argument("--spot", action="store_true",
                        help="price at the seed's spot quote for --instance-type (" + ", ".join(
                            f"{k}: ${v}/h" for k, v in SEED_SPOT_USD_PER_HOUR.items()) + "; spot prices move: "
                        "--price-per-hour gives today's)")
    args = parser.parse_args()

    platform, platform_note = platform_from_args(args, supported=["cpu"], what="space in this study")
    if platform != "cpu":
        message = (f"cpu_resnet is a CPU study (seed 003's CPU post: allocator, threads, NUMA, bf16 on the host "
                   f"CPU); it has no {platform} space. For {platform}, see sweeps/neuron_vit.py.")
        if args.dry_run:
            print(message)
            return
        raise ConfigError("--platform", "cpu or auto", platform, message)
    basis, cost_note = spot_basis(args) if args.spot else cost_basis(args)
    cpus = os.cpu_count() or 1
    size = presets(args)
    bf16, bf16_reason = native_bf16()
    allocators, nodes = allocators_here(platform), numa_node_count()
    base = TrialConfig.make(platform=platform, workload=import_path(CpuResNet), num_workers=0, precision="fp32",
                            cpus_per_worker=cpus, threads=cpus, allocator="glibc", seed=args.seed,
                            instance_type=args.instance_type if args.address else None, **size)
    sweep = Sweep(
        name="cpu_resnet", trainable=fresh_process_trainable, base=base,
        space=make_space(args.smoke, args.full, cpus, bf16, allocators, nodes),
        objectives=[Objective("throughput_samples_per_s", "max")],
        cost=basis, cost_note=cost_note,
        platform_note=(f"{platform_note}; bf16: {'offered' if bf16 else 'not offered'} ({bf16_reason}); allocators "
                       f"found: {', '.join(allocators)}; NUMA nodes: {nodes}"
                       + ("" if nodes > 1 else " (workers across nodes not searched)")),
        **sweep_options(args, default_samples=4 if args.smoke else DEFAULT_SAMPLES,
                        default_time_budget_s=None if args.smoke or args.full else CPU_TIME_BUDGET_S),
    )
    if args.dry_run:
        print(plan_sweep(sweep).describe())
        return
    return run_sweep(sweep)


def spot_basis(args):
    """The seed's spot price for --instance-type, as if given with --price-per-hour."""
    if args.instance_type not in SEED_SPOT_USD_PER_HOUR or args.price_per_hour is not None:
        raise ConfigError("--spot", f"with --instance-type {' or '.join(SEED_SPOT_USD_PER_HOUR)} and no "
                          "--price-per-hour", args.instance_type, "The seed quoted a spot price for that type only.")
    args.price_per_hour = SEED_SPOT_USD_PER_HOUR[args.instance_type]
    basis, _ = cost_basis(args)
    source = f"{args.instance_type} spot, seed 003's quote"
    return (dataclasses.replace(basis, source=source),
            f"price basis: {args.instance_type} at ${args.price_per_hour:g}/h ({source}; spot prices move)")


if __name__ == "__main__":
    main_guard(main)
