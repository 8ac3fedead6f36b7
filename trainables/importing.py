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

__all__ = ["import_path", "importable_module", "load_path"]

IMPORT_PATH_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def import_path(obj: Any) -> str:
    """``module:name`` of a module-level class or function, as another process imports it."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None)
    if not name or not module or "." in name or "<" in name:
        raise ConfigError("import path", "a class or function defined at the top level of a module", obj)
    return f"{importable_module(module)}:{name}"


def importable_module(module_name: str) -> str:
    """The name other processes import the module ``module_name`` by: pass ``__name__``.
    A script run as ``python path/to/study.py`` is ``__main__`` to itself and ``study``
    to Ray's workers (a local Ray instance puts the script's folder on their path); run
    as ``python -m package.study`` it is ``package.study``. So a script's own object
    (an OpSpec instance, say) is ``f"{importable_module(__name__)}:SPEC"``."""
    if module_name != "__main__":
        return module_name
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return spec.name  # python -m package.module
    path = getattr(main, "__file__", None)
    if not path:
        raise ConfigError("module", "a module with a file (a script, not an interactive session)", module_name,
                          "Ray workers import user code from a file: put it in a module and import it from there.")
    stem = os.path.splitext(os.path.basename(path))[0]
    # A script inside an imported package (python mypackage/sweep.py, mypackage
    # installed): its package name, which a cluster's nodes can import too.
    directory = os.path.dirname(os.path.realpath(path))
    for name, module in list(sys.modules.items()):
        if directory in _package_dirs(module):
            return f"{name}.{stem}"
    return stem


def _package_dirs(module: Any) -> set[str]:
    """The folders of a package (none for a plain module, or a module whose ``__path__``
    is not a list of folders, such as ``torch.classes``)."""
    paths = getattr(module, "__path__", None)
    if not isinstance(paths, (list, tuple)) and type(paths).__name__ != "_NamespacePath":
        return set()
    return {os.path.realpath(path) for path in paths if isinstance(path, str)}


def load_path(path: str, field: str, allowed: str, given: Any = None, origin: str = "") -> Any:
    """The object ``path`` ("package.module:Name") names. A malformed path, a module that
    does not import (or raises while importing) and a missing name are ConfigErrors on
    ``field``: ``allowed`` says what it must name, ``given`` what the user wrote (default
    ``path``), ``origin`` where the path came from (an entry point)."""
    given = path if given is None else given
    if not isinstance(path, str) or not IMPORT_PATH_PATTERN.fullmatch(path):
        raise ConfigError(field, f"{allowed}, as an import path 'package.module:Name'", given, origin)
    module_name, attribute = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(field, f"{allowed}, as an importable 'package.module:Name'", given,
                          f"{origin}Importing {module_name} failed: {error}. The module must import on the driver "
                          "and on every Ray worker: installed there, or (a local Ray instance) in the driver "
                          "script's folder.") from error
    except Exception as error:  # its own code raised: the reason, not a bare traceback
        raise ConfigError(field, f"{allowed}, as an importable 'package.module:Name'", given,
                          f"{origin}Importing {module_name} raised {type(error).__name__}: {error}") from error
    if not hasattr(module, attribute):
        raise ConfigError(field, f"{allowed}, as an import path 'package.module:Name'", given,
                          f"{origin}{module_name} has no {attribute}.")
    return getattr(module, attribute)
