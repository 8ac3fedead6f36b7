"""What every platform says about itself.

A platform answers two kinds of question. In the driver, with no accelerator needed:
is it here (``detect``), which knobs of its own it has (``Knobs``, a frozen dataclass
that checks its values), is a config valid on it (``validate``), which Ray resources a
trial asks for (``resources``), which environment a trial gets (``trial_env``), and what
a study starts from and searches here (``study_*``, ``sized_for_cpu``, ...). In the
trial, on the hardware: which device to use (refused with ``PlatformUnavailable`` when
the process got other hardware), how to move batches there, how to step the optimizer,
how to sync, how to time a kernel call, what the compiler did, and how much memory the
trial peaked at. Studies, the loop and the kernel harness ask these: none tests names.

Platform modules import torch and accelerator stacks only inside methods that run in a
trial, so the driver can validate and dry-run any platform on any machine.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from dataclasses import dataclass
from typing import Optional, TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Mapping, Sequence

from accelsweep.trainables.batches import map_tensors
from accelsweep.trainables.compile_cache import cache_location, check_setting, inductor_env
from accelsweep.trainables.platforms.capabilities import Capabilities, not_known
from accelsweep.trainables.errors import one_of
from accelsweep.trainables.timing.windows import Window, time_window
from accelsweep.trainables.precision import get_precision

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.platforms.cpu_threads import ThreadFit


@dataclass(frozen=True)
class Detection:
    available: bool
    reason: str


class PlatformUnavailable(RuntimeError):
    """In a trial: the platform's device is not what this process got (its stack is
    missing, or its framework runs on other hardware). Nothing is timed; the message
    names the platform, what was found and how to fix it."""


def platform_knob(default: Any, *, searched: Sequence[Any]) -> Any:
    """A platform knob field with the values a study searches for it by default
    (``Platform.study_space``); ``searched=()`` keeps it out of the search."""
    return dataclasses.field(default=default, metadata={"searched": tuple(searched)})


@dataclass(frozen=True)
class PlatformKnobs:
    """The knobs a platform owns, beside the generic ones of ``TrialConfig``. Each
    platform declares a frozen subclass: one field per knob (its name is the flat name
    users and search spaces write, its type and default), a comment saying what it does,
    and a ``__post_init__`` that checks its values with the validators of
    ``trainables/errors.py``. Where it is applied is the platform's business (its
    ``trial_env``, ``memory_format``, ``steps_per_execution``, ...). This base has none."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def searched(cls) -> dict[str, tuple[Any, ...]]:
        """Knob -> the values a study searches, in field order: those a ``platform_knob``
        declares, and both values of a bool; a knob with neither is not searched."""
        values = {}
        for field in dataclasses.fields(cls):
            declared = field.metadata.get("searched")
            if declared is None and isinstance(field.default, bool):
                declared = (False, True)
            if declared:
                values[field.name] = declared
        return values


def channels_last_format(channels_last: bool) -> "torch.memory_format":
    """The memory format of a model's 4-D weights and its inputs for the ``channels_last`` knob."""
    import torch

    return torch.channels_last if channels_last else torch.contiguous_format


INSTANCE_RESOURCE_SLIVER = 0.0001  # Ray's resource precision: up to 10,000 workers per node


def instance_resource(instance_type: str) -> str:
    """The Ray resource that marks a node of this EC2 type (declared in cluster.yaml)."""
    return f"instance_type:{instance_type}"


@dataclass(frozen=True)
class TrainingStudy:
    """What the training study (sweeps/neuron_vit.py) tells a platform about its run."""

    smoke: bool = False  # a tiny model, seconds a trial
    cpus: int = 1  # the CPUs of the node a trial runs on
    instance_type: Optional[str] = None  # the node type trials run on (it prices the sweep)
    instance_types: tuple[str, ...] = ()  # CPU node types searched too: a trial owns the one it draws
    nan_capture: bool = False  # each trial saves its first non-finite step: one worker, whose step it can replay


# The training study's models and measurement windows (warm-up steps, then windows of at least so
# many steps and seconds), as config fields: a smoke run's micro ViT, milliseconds a step anywhere,
# and the seed's ViT-B/16, whose windows must hold many fast steps after the compiles of the first.
SMOKE_STUDY_MODEL = dict(model="vit-micro", warmup_steps=2, window_min_steps=3, window_min_s=0.25, windows=2)
SEED_STUDY_MODEL = dict(model="vit-b16", warmup_steps=10, window_min_steps=20, window_min_s=10.0, windows=3)


class Platform(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    precisions: ClassVar[tuple[str, ...]]
    compile_modes: ClassVar[tuple[str, ...]] = ("none",)
    # The platform's own knobs (a PlatformKnobs subclass): TrialConfig.knobs holds one.
    Knobs: ClassVar[type[PlatformKnobs]] = PlatformKnobs
    # torch.autocast's device_type for this platform's device (precision "bf16-autocast").
    autocast_device_type: ClassVar[str]
    # The Ray resource a trial's cost share is counted in ("CPU", "GPU", "neuron_cores").
    cost_unit: ClassVar[str] = "CPU"
    # Why this platform's trials are never priced (None: they are, given a price basis): a
    # stand-in's throughput is not that of the hardware it holds, so a price per sample
    # would be a figure for hardware that did not run.
    unpriced_because: ClassVar[Optional[str]] = None
    # True where the host clock after a step is the step's real end (synchronous
    # execution). Elsewhere per-step host times only time the enqueue, so step-time
    # percentiles come from window means instead.
    host_clock_times_steps: ClassVar[bool] = False
    # Whether one trial process may run trial after trial. False where a trial's
    # environment is read once per process (a runtime that initialises at first use).
    reuses_processes: ClassVar[bool] = True
    # Whether torch tensors live on a torch-xla device here (lazy: traced, then compiled).
    torch_on_xla: ClassVar[bool] = False
    # The backend JAX must report for a JAX kernel to run here (jax.devices()[0].platform);
    # None where JAX kernels do not run. Anything else would time the kernel somewhere the
    # trial did not ask for (JAX on its CPU backend when asked for a TPU).
    jax_backend: ClassVar[Optional[str]] = None
    # How ``time_calls`` times one call (a kernel result's ``timer``).
    call_timer: ClassVar[str] = "host clock"
    # The compile cache (trainables/compile_cache.py): the packages whose versions name its
    # subdirectory, the variable that points the compiler at it, what the compiler does when
    # that is unset, and whether it reads s3:// itself. Here: torch.compile's inductor.
    compiler_packages: ClassVar[tuple[str, ...]] = ("torch",)
    compile_cache_variable: ClassVar[str] = "TORCHINDUCTOR_CACHE_DIR"
    compile_cache_unset: ClassVar[str] = "inductor's default (/tmp/torchinductor_<user>)"
    remote_compile_cache: ClassVar[bool] = False

    # What studies (sweeps/) size a trial by, so that none of them tests platform names.
    # Whether studies size their trials for a CPU here: smaller models, batches and windows, and a
    # time budget (the seeds' models take seconds a step on a CPU). The xla platform trains on a CPU
    # too, but as the accelerators' code path under test: it gets their sizes.
    sized_for_cpu: ClassVar[bool] = False
    # Whether a trial computes on every CPU it holds, so that a study gives one trial all of its
    # node's (``trial_cpus``); elsewhere a worker holds one CPU beside its device.
    trial_owns_cpus: ClassVar[bool] = False
    # The precision studies train at where they neither search it nor start from the seed's fp32.
    training_precision: ClassVar[str] = "fp32"
    # Whether studies feed the device from DataLoader processes on CPUs of their own (a GPU steps
    # faster than the training process alone makes batches).
    loader_processes: ClassVar[bool] = False
    # The largest batch per device a study starts from here; None: the study's own.
    max_study_batch: ClassVar[Optional[int]] = None
    # What a host read of a device value (a would-be sync) costs here.
    host_read_cost: ClassVar[str] = "not known for this platform"
    # The training study's batch sizes (per worker) around the seed's 16 per NeuronCore.
    study_batch_sizes: ClassVar[tuple[int, ...]] = (4, 8, 16, 32)

    # ---- driver side -------------------------------------------------------------
    @abc.abstractmethod
    def detect(self) -> Detection:
        """Whether this machine has the platform, and why (or why not)."""

    def validate(self, config: "TrialConfig") -> None:
        one_of("precision", config.precision, self.precisions,
               f"Platform {self.name!r} supports these precisions.")
        one_of("torch_compile", config.torch_compile, self.compile_modes,
               f"Platform {self.name!r} supports these torch.compile modes.")
        check_setting(config.compile_cache, remote=self.remote_compile_cache)
        # Each knob checked its own value (self.Knobs.__post_init__); what is left here and
        # in the subclasses are the checks that need the generic fields too.

    def capabilities(self, config: Any) -> Capabilities:
        """What the hardware of this config's trials does natively, and the knob values it
        only emulates (removed from a sweep's space unless kept). ``config`` may be any
        sweep config (a kernel's, a user's): read its fields with getattr defaults.
        Here: nothing known, nothing removed."""
        return not_known(self.description, f"platform {self.name!r} does not read its hardware")

    def first_guess(self, config: "TrialConfig", choices: "Mapping[str, Sequence[Any]]",
                    capabilities: Capabilities) -> dict[str, tuple[Any, str]]:
        """The values a performance engineer would try first on this hardware for the
        searched knobs (``choices``: knob -> the values the space offers), each with why:
        knob -> (value, reason). A sweep proposes them as one config right after the
        baseline (sweeps/driver/define/first_guess.py); they are a proposal to measure, never a
        figure. Here: no rules, no guess."""
        return {}

    def trial_cpus(self, cpus: int) -> dict[str, Any]:
        """The config values that give a trial on a node of ``cpus`` CPUs its share of them:
        all (``trial_owns_cpus``), else one per worker."""
        return {"cpus_per_worker": cpus if self.trial_owns_cpus else 1}

    # ---- the training study (sweeps/neuron_vit.py): what it starts from and searches here
    def study_model(self, study: TrainingStudy) -> dict[str, Any]:
        """The model the training study trains here and its measurement windows, as config
        fields: the seed's ViT-B/16; a smoke run's micro ViT."""
        return dict(SMOKE_STUDY_MODEL if study.smoke else SEED_STUDY_MODEL)

    def study_baseline(self, study: TrainingStudy) -> dict[str, Any]:
        """The baseline's values of this platform's choosing, beside the seed's batch 16, fp32
        and no loader workers: here, a trial's CPUs."""
        return self.trial_cpus(study.cpus)

    def study_space(self, trial: Any, precision: str, study: TrainingStudy) -> Optional[dict[str, Any]]:
        """Suggest this platform's knobs on ``trial`` (an Optuna trial that has drawn the
        generic knobs, ``precision`` among them) and return the values that draw fixes, or
        None. Here: every knob the platform declares a search for (``PlatformKnobs.searched``)."""
        for name, values in self.Knobs.searched().items():
            trial.suggest_categorical(name, list(values))
        return None

    def check_cluster_node_type(self, instance_type: Optional[str]) -> None:
        """On a cluster, refuse a sweep that does not name the node type its trials need
        (``instance_type``: what --instance-type gave). Here any node will do."""

    def worker_resources(self, config: "TrialConfig") -> dict[str, float]:
        """What one worker process of a trial asks Ray for: its devices, and a sliver of
        the node type's own resource when the config pins one (cluster.yaml declares
        ``instance_type:<type>: 1`` per node type; a sliver lets many workers share it)."""
        resources = self.device_resources(config)
        instance_type = getattr(config, "instance_type", None)  # kernel configs have none
        if instance_type:
            resources[instance_resource(instance_type)] = INSTANCE_RESOURCE_SLIVER
        return resources

    def device_resources(self, config: "TrialConfig") -> dict[str, float]:
        """The CPUs and accelerators one worker holds."""
        return {"CPU": config.cpus_per_worker}

    def resources(self, config: "TrialConfig") -> dict[str, float]:
        """What the whole trial holds: all its workers (the basis of its cost share)."""
        return {k: v * config.workers for k, v in self.worker_resources(config).items()}

    def trial_actor_resources(self, config: "TrialConfig") -> dict[str, float]:
        """What Tune reserves for the trial's own process. With several workers it only
        drives a TorchTrainer, whose workers reserve their own resources; reserving them
        twice would leave a trial waiting forever for itself."""
        if config.workers == 1:
            return self.worker_resources(config)
        return {"CPU": 0, "memory": 1}  # Ray refuses an empty request; one byte is none

    def usd_per_hour(self, cost: Any, config: "TrialConfig") -> float:
        """What the resources a trial of ``config`` holds cost per hour on the price basis
        ``cost`` (a CostBasis); NaN with none, or where this platform is never priced."""
        if cost is None or self.unpriced_because:
            return float("nan")
        return cost.hourly_rate(self.resources(config))

    def train_backend(self, config: "TrialConfig"):
        """The Ray Train backend config for a multi-worker trial (gloo by default)."""
        from ray.train.torch import TorchConfig

        return TorchConfig(backend="gloo")

    def trial_env(self, config: "TrialConfig") -> dict[str, str]:
        return self.compile_cache_env(config)

    def compile_cache(self, config: "TrialConfig") -> Optional[str]:
        """Where this config's trial caches what it compiles (a directory, or s3:// where the
        compiler reads it); None where it compiles nothing (eager) or the cache is off."""
        if config.torch_compile == "none":
            return None
        return cache_location(config.compile_cache, self.name, self.compiler_packages, self.compiler_flags(config))

    def compiler_flags(self, config: "TrialConfig") -> str:
        """Compiler flags that change what it builds and that its own cache may not key on
        (they name the cache's subdirectory). Inductor keys on its whole config: none."""
        return ""

    def compile_cache_env(self, config: "TrialConfig") -> dict[str, str]:
        """The variables that point this platform's compiler at ``compile_cache``."""
        location = self.compile_cache(config)
        return inductor_env(location) if location else {}

    def steps_per_execution(self, config: "TrialConfig") -> int:
        """How many training steps the device runs as one unit (one compiled graph on
        XLA): the loop warms up and times whole units. 1 on eager platforms."""
        return 1

    # ---- trial side --------------------------------------------------------------
    def runtime_env(self) -> dict[str, str]:
        """The environment any process of this platform needs before its framework starts
        (a training trial's ``trial_env`` adds its knobs; a kernel trial needs only this)."""
        return {}

    def prepare(self, config: "TrialConfig") -> "torch.device":
        """Apply the config to this process and return the device to train on."""
        os.environ.update(self.trial_env(config))
        return self.device(config)

    def device(self, config: "TrialConfig") -> "torch.device":
        """The device a trial in this process trains on."""
        return self.torch_device()

    @abc.abstractmethod
    def torch_device(self) -> "torch.device":
        """The device torch tensors go to in this process, checked to be this platform's
        hardware: PlatformUnavailable otherwise, so nothing is timed on another device."""

    def device_batches(self, loader: Iterable, device: "torch.device", config: "TrialConfig") -> Iterable:
        def to_device(tensor: "torch.Tensor") -> "torch.Tensor":
            return tensor.to(device, non_blocking=True)

        # Inputs may be a tensor or a tuple or dict of them (trainables/batches.py).
        for inputs, targets in loader:
            yield map_tensors(to_device, inputs), map_tensors(to_device, targets)

    def optimizer_step(self, optimizer: Any) -> None:
        optimizer.step()

    def memory_format(self, config: "TrialConfig") -> "torch.memory_format":
        """The memory format of the model's weights and of every batch."""
        return channels_last_format(False)

    def autocast(self, config: "TrialConfig"):
        """The context the forward pass runs in: torch.autocast where the precision asks for it."""
        return get_precision(config.precision).autocast_context(self.autocast_device_type)

    def distribute(self, model: Any, device: "torch.device") -> Any:
        """Wrap the model for data-parallel training (called only with several workers)."""
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    def compile(self, model: Any, config: "TrialConfig") -> Any:
        import torch

        if config.torch_compile == "none":
            return model
        if config.torch_compile == "max-autotune":
            # Inductor, benchmarking kernel choices (GEMM templates) while it compiles:
            # longer compiles for faster steps.
            return torch.compile(model, backend="inductor", mode="max-autotune")
        if config.torch_compile == "reduce-overhead":
            # Inductor, its kernels captured and replayed as CUDA graphs (CUDA only): fewer launches.
            return torch.compile(model, backend="inductor", mode="reduce-overhead")
        return torch.compile(model, backend=config.torch_compile)

    @abc.abstractmethod
    def sync(self, device: "torch.device") -> None:
        """Block until all work queued on the device has finished."""

    def reset_peak_memory(self, device: "torch.device") -> None:
        pass

    def peak_memory_mb(self, device: "torch.device") -> float:
        """The trial's peak since ``reset_peak_memory`` (NaN where the platform cannot say)."""
        return float("nan")

    def memory_in_use_mb(self, device: "torch.device") -> float:
        """What is held now, in the same measure as ``peak_memory_mb``: the loop takes it
        before the workload is built, and reports the peak over it as the workload's own
        memory (``workload_memory_mb``). NaN where there is no such figure, or where the
        peak cannot be reset (a reused process would report an earlier trial's peak)."""
        return float("nan")

    def describe_device(self, device: "torch.device") -> str:
        return str(device)

    def ordered_knobs(self, config: "TrialConfig") -> dict[str, tuple[str, Optional[int]]]:
        """The knobs whose values are ordered, each with how the search steps past a space's
        largest value ("x2", "+1") and the most it may reach on this hardware for ``config``
        (None: no bound but memory and the figures; sweeps/driver/define/edges.py). Here: the
        batch, doubled, up to ``max_study_batch`` where the platform has one."""
        return {"batch_size": ("x2", self.max_study_batch)}

    def memory_capacity_mb(self, device: "torch.device") -> float:
        """The memory a trial's ``peak_memory_mb`` is measured against (NaN: unknown here):
        how far a larger batch may go."""
        return float("nan")

    def thread_fit(self, config: "TrialConfig", measure: bool = True) -> Optional["ThreadFit"]:
        """Started at a trial's start, when the trial's threads are this platform's to fit
        to the cores other processes leave free (cpu_threads.py; ``measure`` False: the
        threads asked, its niceness lowered); None where the device, not the host's cores,
        does the work."""
        return None

    def trial_tags(self, device: "torch.device") -> dict[str, str]:
        """Text this platform adds to each result of a trial (strings become the trial's
        MLflow tags): what placement gave it, what kind of figure it is. Called by every
        worker of a trial at the same point (a platform may gather over them)."""
        return {}

    def time_calls(self, call: Callable[[], Any], device: "torch.device", min_calls: int,
                   min_seconds: float) -> Window:
        """A window of calls of a torch kernel on ``device``, each timed to its completion:
        the host clock around the call and a sync (``call_timer`` says so in results)."""
        def call_and_wait() -> Any:
            output = call()  # held through the sync: a lazy (XLA) output nobody holds is never computed
            self.sync(device)
            return output

        return time_window(call_and_wait, lambda: None, min_calls, min_seconds)

    def time_jax_calls(self, call: Callable[[], Any], wait: Callable[[Any], Any], min_calls: int,
                       min_seconds: float) -> Window:
        """A window of calls of a JAX kernel, each timed on the host clock to ``wait``
        (``block_until_ready``) on its output. A platform whose device is asynchronous and
        fast may time batches instead (cuda)."""
        return time_window(lambda: wait(call()), lambda: None, min_calls, min_seconds)

    def compile_stats(self) -> dict[str, float]:
        """Compiler counters for this process: graph compilations and their seconds."""
        return {}

    def compile_count(self) -> float:
        """Graph compilations so far in this process; NaN where the platform counts none."""
        return float("nan")

    def compile_cache_in_effect(self) -> str:
        """Where this process's compiler caches now: what its variable says (inductor sets
        its own to the directory it used), else what it does by default."""
        return os.environ.get(self.compile_cache_variable) or self.compile_cache_unset

    def explain_failure(self, error: BaseException, config: "TrialConfig", since: float) -> Optional[Exception]:
        """An exception that says more than ``error`` (raised since time.time() ``since``),
        or None to let it stand. The failed trial's record shows what this returns."""
        return None
