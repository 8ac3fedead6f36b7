"""Names of user code that every process can load: ``package.module:Name`` import paths.

A sweep's config travels to Ray workers as a flat dict, on other processes and other
nodes; a workload or a kernel op in it is named by import path, and loaded there.

    import_path(TinyLM)           # "my_package.lm:TinyLM"; in a script: "<its file stem>:TinyLM"
    load_path("my_package.lm:TinyLM", field="workload", allowed="a Workload subclass")

A script's own classes can be named too: Ray puts the driver script's directory on its
local workers' ``sys.path``, so ``<file stem>:Name`` imports there (on a cluster, the
module must be installed on the nodes or shipped with a runtime_env).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

from accelsweep.trainables.errors import ConfigError

__all__ = ["import_path", "load_path"]

IMPORT_PATH_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def import_path(obj: Any) -> str:
    """``module:name`` of a module-level class, function or object with ``__name__``."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None)
    if not name or not module or "." in name or "<" in name:
        raise ConfigError("import path", "a class or function defined at the top level of a module", obj)
    if module == "__main__":
        module = _main_module_name()
    return f"{module}:{name}"


def _main_module_name() -> str:
    """The name the running script imports under in another process."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return spec.name  # python -m package.module
    path = getattr(main, "__file__", None)
    if not path:
        raise ConfigError("import path", "a class defined in a module or script file (not an interactive session)",
                          "__main__", "Move it to a .py file and import it from there.")
    directory = os.path.dirname(os.path.realpath(path))
    if directory not in {os.path.realpath(p or os.curdir) for p in sys.path}:
        raise ConfigError("import path", "a script whose directory is on sys.path", path)
    return os.path.splitext(os.path.basename(path))[0]


def load_path(path: str, field: str, allowed: str) -> Any:
    """The object ``path`` names; a bad path, a failing import or a missing name is a
    ConfigError on ``field`` (``allowed`` says what it must name)."""
    if not isinstance(path, str) or not IMPORT_PATH_PATTERN.fullmatch(path):
        raise ConfigError(field, f"{allowed}, as an import path 'package.module:Name'", path)
    module_name, attribute = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(field, f"{allowed}, as an importable 'package.module:Name'", path,
                          f"Importing {module_name} failed ({error}); it must be importable where trials run "
                          "(installed, or beside the driver script for a local Ray instance).") from None
    if not hasattr(module, attribute):
        raise ConfigError(field, f"{allowed}, as an import path 'package.module:Name'", path,
                          f"{module_name} has no {attribute}.")
    return getattr(module, attribute)
