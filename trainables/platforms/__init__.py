"""The platform registry: one entry per place a trial can run.

``auto`` picks the best platform present, in the order of ``AUTO_ORDER``, and says
what it picked and why. The xla platform is never picked automatically: on a machine
without an accelerator it would only run the XLA CPU client, which is a test lane,
not a faster way to train.
"""

from __future__ import annotations

from typing import Optional, Sequence

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms.base import Detection, Platform, PlatformUnavailable
from accelsweep.trainables.platforms.cpu import CpuPlatform
from accelsweep.trainables.platforms.cuda import CudaPlatform
from accelsweep.trainables.platforms.neuron import NeuronPlatform
from accelsweep.trainables.platforms.neuron_standin import NeuronStandinPlatform
from accelsweep.trainables.platforms.tpu import TpuPlatform
from accelsweep.trainables.platforms.xla import XlaPlatform

# The Neuron stand-in (neuron_standin.py) is never picked by ``auto``: it holds NeuronCores
# but trains on the CPU, so it is for showing placement, asked for by name.
PLATFORMS: dict[str, Platform] = {p.name: p for p in (CpuPlatform(), CudaPlatform(), XlaPlatform(), NeuronPlatform(),
                                                   TpuPlatform(), NeuronStandinPlatform())}
PLATFORM_NAMES = tuple(PLATFORMS)
# Where torch tensors live on a torch-xla device (kernel registrations run torch ops there).
TORCH_XLA_PLATFORMS = tuple(name for name, platform in PLATFORMS.items() if platform.torch_on_xla)
AUTO_ORDER = ("neuron", "tpu", "cuda", "cpu")


def get_platform(name: str) -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise ConfigError("platform", f"one of {', '.join(PLATFORM_NAMES)}", name) from None


def resolve_platform(name: str, among: Optional[Sequence[str]] = None, what: str = "") -> tuple[Platform, str]:
    """Return the platform for ``name`` (or the best one present for ``auto``) and a
    sentence saying why. A named platform that is not present is an error. ``among``:
    the platforms ``auto`` may pick (a kernel study's: those with an implementation of
    its op, which ``what`` names)."""
    if name == "auto":
        return _best_present(among, what)
    platform = get_platform(name)
    detection = platform.detect()
    if not detection.available:
        raise ConfigError("platform", f"a platform present on this machine (use --dry-run to plan for {name!r} "
                          "without its hardware)", name, detection.reason)
    return platform, f"{name} as asked: {detection.reason}"


def _best_present(among: Optional[Sequence[str]], what: str) -> tuple[Platform, str]:
    skipped = []
    for candidate in AUTO_ORDER:
        if among is not None and candidate not in among:
            skipped.append(f"{candidate} has no {what}")
            continue
        detection = PLATFORMS[candidate].detect()
        if detection.available:
            picked = f"picked {candidate}" + (f", the first platform present with {what}" if among is not None else "")
            why = f"{picked}: {detection.reason}" + (f" ({'; '.join(skipped)})" if skipped else "")
            return PLATFORMS[candidate], why
        skipped.append(f"no {candidate}: {detection.reason}")
    raise ConfigError("platform", f"a platform present on this machine with {what} (auto looks at "
                                  f"{', '.join(AUTO_ORDER)})", "auto", "; ".join(skipped) + ".")


__all__ = ["Detection", "Platform", "PlatformUnavailable", "PLATFORMS", "PLATFORM_NAMES", "TORCH_XLA_PLATFORMS",
           "get_platform", "resolve_platform"]
