"""The software and hardware a trial ran on, as MLflow tags."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

from accelsweep.trainables.platforms.cpu import ONEDNN_ISA_VARIABLES

# Distribution name -> tag name. Neuron packages appear only where installed.
TRACKED_PACKAGES = {
    "torch": "torch", "torchvision": "torchvision", "timm": "timm", "ray": "ray", "optuna": "optuna",
    "mlflow": "mlflow", "numpy": "numpy", "torch-xla": "torch_xla", "torch-neuronx": "torch_neuronx",
    "neuronx-cc": "neuronx_cc", "libneuronxla": "libneuronxla", "jax": "jax", "jaxlib": "jaxlib",
}


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for distribution, tag in TRACKED_PACKAGES.items():
        try:
            versions[tag] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def environment_tags() -> dict[str, str]:
    tags = {f"version.{name}": version for name, version in package_versions().items()}
    tags["host.cpus"] = str(os.cpu_count())
    tags["host.machine"] = platform.machine()
    tags["host.os"] = f"{platform.system()} {platform.release()}"
    tags["host.python_executable"] = sys.executable
    # oneDNN held below the CPU's own ISA (e.g. AVX2 on an AVX-512 bf16 CPU: bf16 emulated,
    # several times slower): the same CPU measuring other speeds, so part of the hardware.
    for name in ONEDNN_ISA_VARIABLES:
        if os.environ.get(name):
            tags[f"host.{name.lower()}"] = os.environ[name]
    return tags
