"""Packaging: the folders ``sweeps/``, ``trainables/`` and ``kernels/`` install as
``accelsweep.sweeps``, ``accelsweep.trainables`` and ``accelsweep.kernels``, under the
front door ``accelsweep/`` (the public names, and the paths of the previous release).

pyproject.toml holds the metadata. This file exists only because a prefix cannot be
added by pyproject's package discovery: every subpackage would have to be listed by hand
there, and an op folder left off that list would be missing from wheels. Here a new
``kernels/<op>/`` folder is found like any other.
"""

from setuptools import find_namespace_packages, setup

ROOTS = ("sweeps", "trainables", "kernels")


def subpackages(root: str) -> list[str]:
    """Every folder under root, also one that holds only data files (kernels/giou/gpsimd's
    C++ sources): setuptools ships a folder's files only when the folder is a listed
    package, and warns at every install about one that is not."""
    return [name for name in find_namespace_packages(root) if "__pycache__" not in name.split(".")]


setup(
    package_dir={"accelsweep": "accelsweep", **{f"accelsweep.{root}": root for root in ROOTS}},
    packages=["accelsweep", *(f"accelsweep.{root}" + (f".{sub}" if sub else "")
                              for root in ROOTS for sub in ("", *subpackages(root)))],
)
