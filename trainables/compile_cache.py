"""Where a trial's compiler keeps what it compiled, so that a graph compiled once, by any
trial of any sweep, is loaded the next time instead of compiled again.

    ACCELSWEEP_COMPILE_CACHE=/shared/accelsweep/compile python sweeps/cpu_resnet.py ...
    TrialConfig.make(platform="neuron", compile_cache="s3://bucket/accelsweep/compile", ...)
    TrialConfig.make(torch_compile="inductor", compile_cache="off")  # the compilers' own defaults

The root (``cache_root``) holds one subdirectory per compiler build (``cache_key``). The
platform turns the location into its compiler's variable (``Platform.trial_env``), which
``Platform.prepare`` puts in the trial's process before anything compiles (and
fresh_process.py in a new process's environment). Each trial reports where its compiler
cached (``compile_cache_location``, a tag) and its cache hits and misses (train_loop.py).

A leaf (standard library and the errors module only): the driver resolves locations without torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from typing import Mapping, Optional, Sequence

from accelsweep.trainables.errors import ConfigError

__all__ = ["ENV_VAR", "OFF", "cache_key", "cache_location", "cache_root", "check_setting", "default_root",
           "dynamo_cache_counts", "inductor_env", "installed_version"]

ENV_VAR = "ACCELSWEEP_COMPILE_CACHE"
OFF = "off"
ALLOWED = "an absolute directory (or ~/...), an s3:// URL on platform neuron, 'off', or None"

# The counters inductor and AOTAutograd keep per process (torch._dynamo.utils.counters), by
# the metric that reports each: incremented in FxGraphCache.prepare_key and load_with_key
# (torch/_inductor/codecache.py) and AOTAutogradCache.try_load (torch/_functorch/
# _aot_autograd/autograd_cache.py), torch 2.14. A bypass is a graph the cache cannot hold (it never hits).
# On an AOTAutograd hit the forward and backward graphs are loaded through the FX graph
# cache, so each counts an FX graph hit too.
DYNAMO_CACHE_COUNTERS = {
    "fxgraph_cache_hits": ("inductor", "fxgraph_cache_hit"),
    "fxgraph_cache_misses": ("inductor", "fxgraph_cache_miss"),
    "fxgraph_cache_bypasses": ("inductor", "fxgraph_cache_bypass"),
    "aotautograd_cache_hits": ("aot_autograd", "autograd_cache_hit"),
    "aotautograd_cache_misses": ("aot_autograd", "autograd_cache_miss"),
    "aotautograd_cache_bypasses": ("aot_autograd", "autograd_cache_bypass"),
}


def check_setting(value: Optional[str], field: str = "compile_cache", remote: bool = True) -> None:
    """A root as a config or ``ACCELSWEEP_COMPILE_CACHE`` may give it. Relative paths are
    refused: each trial runs in its own working directory, so each would get its own cache.
    ``remote``: whether s3:// is allowed (only Neuron's compiler reads S3 itself)."""
    if value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(field, ALLOWED, value)
    if value.strip().lower() == OFF:
        return
    if "://" in value:
        if not value.startswith("s3://"):
            raise ConfigError(field, ALLOWED, value, "The compilers read local (or mounted) directories; "
                                                     "Neuron's also reads S3.")
        if not remote:
            raise ConfigError(field, ALLOWED, value, "Only Neuron's compiler reads S3 itself: for inductor and "
                                                     "torch-xla, name a directory every node mounts.")
        return
    if not os.path.isabs(os.path.expanduser(value)):
        raise ConfigError(field, ALLOWED, value, "Each trial runs in its own working directory: a relative path "
                                                 "would give each trial a cache of its own.")


def default_root(environ: Optional[Mapping[str, str]] = None) -> str:
    """One directory per user: $XDG_CACHE_HOME/accelsweep/compile, else ~/.cache/accelsweep/compile
    (a relative XDG_CACHE_HOME is ignored, as the XDG base directory spec says)."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "accelsweep", "compile")


def cache_root(setting: Optional[str] = None, environ: Optional[Mapping[str, str]] = None,
               default: bool = True) -> Optional[str]:
    """The root in effect: ``setting`` (the config's field), else $ACCELSWEEP_COMPILE_CACHE
    in the process that applies the trial's environment, else ``default_root`` (when
    ``default``). None when off, or when nothing is named and ``default`` is False.

    On a cluster, name a directory every node sees (or, on Neuron, s3://) in the field or in
    every node's environment: a variable set only in the driver's shell reaches trials only
    where Ray's workers inherit it (a local Ray). ``off`` leaves every compiler as it is:
    inductor caches in /tmp/torchinductor_<user>, Neuron in /var/tmp/neuron-compile-cache,
    torch-xla nowhere (it sets nothing, so a process that ran an earlier trial keeps what
    that trial set)."""
    environ = os.environ if environ is None else environ
    value, field = (setting, "compile_cache") if setting is not None else (environ.get(ENV_VAR) or None, ENV_VAR)
    if value is None:
        return default_root(environ) if default else None
    check_setting(value, field)
    if value.strip().lower() == OFF:
        return None
    return value if value.startswith("s3://") else os.path.abspath(os.path.expanduser(value))


def installed_version(distribution: str) -> Optional[str]:
    """A package's version from its installed metadata (no import: neuronx-cc or torch-xla
    cost seconds to import); None where it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cache_key(platform: str, packages: Sequence[str] = (), flags: str = "") -> str:
    """The subdirectory of one compiler build: the platform, each installed package's name
    and version, and a hash of the compiler flags (when there are any). '' for no packages
    and no flags: the compiler keys its own cache (Neuron).

    The name holds what makes artifacts incompatible where the compiler's own cache does not
    already key on it:
    - inductor (cpu, cuda): ``cpu_torch-2.14.1``, ``cuda_torch-2.14.1_triton-3.8.0``. Its
      caches key on more than that already: the FX graph cache on a hash of torch's source
      and version, the GPU and Triton version, the inductor config (mode max-autotune
      included) and the CPU thread count (FxGraphHashDetails in torch/_inductor/codecache.py:
      torch_key, CacheBase.get_system, config.save_config_portable,
      cpp_runtime_thread_count); the AOTAutograd cache on all of that plus its own config,
      grad and autocast state (AOTAutogradCacheDetails in
      torch/_functorch/_aot_autograd/autograd_cache.py). The version in the name only keeps
      one build's files together, to be deleted with it.
    - torch-xla (xla, tpu): ``xla_torch-2.9.0_torch-xla-2.9.0_flags-<hash of XLA_FLAGS>``.
      torch-xla's persistent cache looks graphs up by their hash (torch_xla/runtime.py:
      initialize_cache, get_num_cached_compilation_graph); nothing there says the key holds
      torch-xla's version or XLA_FLAGS.
    - Neuron: no subdirectory. Its cache is ``neuronxcc-<version>/MODULE_<graph
      hash>+<flags hash>``: "The cache uses hash of the Neuron compiler flags and XLA graph
      as the key. If the Neuron compiler version or XLA graph changes, you will see
      recompilation" (aws-neuron-sdk, general/arch/neuron-features/neuron-caching.rst). Its
      location is also computed in the driver (neuron_parallel_compile's environment,
      sweeps/driver/run/neuron_precompile.py), whose machine need not have neuronx-cc: a
      version read there could name another directory than the trials'."""
    if not packages and not flags:
        return ""
    parts = [platform] + [f"{name}-{version}" for name in packages
                          if (version := installed_version(name)) is not None]
    if flags.strip():
        parts.append("flags-" + hashlib.sha256(" ".join(flags.split()).encode()).hexdigest()[:12])
    return "_".join(part.replace(os.sep, "-") for part in parts)


def cache_location(setting: Optional[str], platform: str, packages: Sequence[str] = (), flags: str = "",
                   default: bool = True, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Where a trial's compiler caches: the root (``cache_root``) and the build's key
    (``cache_key``) under it; None when the cache is off."""
    root = cache_root(setting, environ, default)
    if root is None:
        return None
    key = cache_key(platform, packages, flags)
    if not key:
        return root
    return f"{root.rstrip('/')}/{key}" if root.startswith("s3://") else os.path.join(root, key)


def inductor_env(location: str) -> dict[str, str]:
    """Inductor's caches in ``location``, both switched on. torch 2.14 has both on by
    default; the variables (read when torch._inductor.config and torch._functorch.config are
    first imported: env_name_force) keep them on whatever an earlier default said. Triton's
    cache lands in ``location``/triton unless TRITON_CACHE_DIR is set (pytorch/tutorials,
    recipes_source/torch_compile_caching_configuration_tutorial.rst)."""
    return {"TORCHINDUCTOR_CACHE_DIR": location, "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}


def dynamo_cache_counts() -> dict[str, float]:
    """This process's FX graph and AOTAutograd cache counts so far (``DYNAMO_CACHE_COUNTERS``)."""
    from torch._dynamo.utils import counters

    return {metric: float(counters[group][name]) for metric, (group, name) in DYNAMO_CACHE_COUNTERS.items()}
