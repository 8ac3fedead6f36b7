"""The layout the code relies on: one installed name (``accelsweep.*``), no import circles.

Both are read from the source itself (its syntax tree), so they hold for code that no
test happens to import, and a bare ``import kernels`` in a corner of the tree fails here
instead of importing another distribution's ``kernels`` on a user's machine.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOTS = ("sweeps", "trainables", "kernels")  # installed as accelsweep.<root>
SKIPPED_DIRS = {".git", "__pycache__", "build", "dist"}
BARE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(sweeps|trainables|kernels)\b", re.M)
BARE_MODULE_STRING = re.compile(r"""["'](sweeps|trainables|kernels)\.[A-Za-z_]""")
BARE_DASH_M = re.compile(r"-m\s+(sweeps|trainables|kernels)\.")
# This file spells the bare names out to look for them; test_install.py builds a stand-in
# distribution that owns a top-level ``kernels``, to prove ours no longer collides with it.
BARE_NAMES_ON_PURPOSE = {"test_layout.py", "test_install.py"}


def _files(suffixes: tuple[str, ...]) -> list[Path]:
    found = []
    for directory, subdirs, files in os.walk(REPO):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS and not d.startswith(".venv")
                      and not d.endswith(".egg-info")]
        found += [Path(directory, f) for f in files if f.endswith(suffixes)]
    return sorted(found)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["accelsweep", *parts])


def _source_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _files((".py",)) if p.relative_to(REPO).parts[0] in ROOTS}


def test_no_bare_imports_anywhere_in_the_tree():
    offenders = []
    for path in _files((".py", ".md", ".yaml", ".yml", ".sh", ".toml")):
        if path.name in BARE_NAMES_ON_PURPOSE:
            continue
        text = path.read_text(errors="replace")
        patterns = (BARE_IMPORT, BARE_DASH_M) + ((BARE_MODULE_STRING,) if path.suffix == ".py" else ())
        for pattern in patterns:
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                offenders.append(f"{path.relative_to(REPO)}:{line}: {match.group(0).strip()}")
    assert not offenders, "bare top-level names (use accelsweep.<name>):\n" + "\n".join(offenders)


def test_the_bare_import_check_finds_what_it_looks_for():
    # The check above is only as good as its patterns: each must catch its form.
    assert BARE_IMPORT.search("import kernels.giou\n")
    assert BARE_IMPORT.search("    from trainables.config import TrialConfig\n")
    assert not BARE_IMPORT.search("from accelsweep.trainables.config import TrialConfig\n")
    assert BARE_MODULE_STRING.search('KernelImpl("x", "kernels.giou.torch_impl:giou", ...)')
    assert not BARE_MODULE_STRING.search('"accelsweep.kernels.giou.torch_impl:giou"')
    assert BARE_DASH_M.search("python -m trainables.stability")
    assert not BARE_DASH_M.search("python -m accelsweep.trainables.harness.stability")


def _in_type_checking_block(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph() -> dict[str, set[str]]:
    """Module -> the accelsweep modules it imports, at module level or inside functions
    (a lazy import still closes a circle; it only hides it until run time). Imports
    under ``if TYPE_CHECKING:`` never run and are left out."""
    modules = _source_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or _in_type_checking_block(node, parents):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                assert node.level == 0, f"{path}: relative import; use the accelsweep.* name"
                base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_import_graph_sees_lazy_imports():
    graph = import_graph()
    # trainables/trainable.py imports the training loop inside its functions only.
    assert "accelsweep.trainables.loop.train_loop" in graph["accelsweep.trainables.trainable"]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (break them; a lazy import only hides one):\n" + "\n".join(
        " <-> ".join(c) for c in found)


@pytest.mark.parametrize("root", ROOTS)
def test_every_package_folder_is_a_package(root):
    # setup.py installs the packages it finds: a folder of modules without __init__.py
    # would be left out of a wheel while working from the repository.
    for directory, subdirs, files in os.walk(os.path.join(REPO, root)):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        if any(f.endswith(".py") for f in files):
            assert "__init__.py" in files, f"{directory} has modules but no __init__.py"


def test_the_rooms_say_who_uses_them():
    """What a trial's process runs (trainables/) imports nothing of the sweep's driver, and
    the MLflow record is the driver's alone (sweeps/driver/record/): no trial-side module
    imports MLflow, so a trial never writes to the store."""
    graph = import_graph()
    upward = {module: sorted(t for t in targets if t.startswith("accelsweep.sweeps"))
              for module, targets in graph.items() if module.startswith(("accelsweep.trainables", "accelsweep.kernels"))}
    assert not {m: t for m, t in upward.items() if t}, "trial-side modules importing the driver"
    mlflow_users = []
    for path in _files((".py",)):
        parts = path.relative_to(REPO).parts
        if parts[0] in ("trainables", "kernels") and re.search(r"^\s*(import|from)\s+mlflow\b", path.read_text(), re.M):
            mlflow_users.append(str(path.relative_to(REPO)))
    assert not mlflow_users, f"trial-side modules importing MLflow: {mlflow_users}"
    assert os.path.isdir(os.path.join(REPO, "sweeps", "driver", "record"))


@pytest.mark.parametrize("left_by_a_run", ["mlflow.db", "mlflow.db.lock", "mlflow.optuna.db", "mlflow.optuna.db.lock",
                                           "optuna.db", "mlartifacts/0/x", "ray_results/x", "site/index.html"])
def test_what_a_run_leaves_beside_its_store_is_ignored_by_git(left_by_a_run):
    """A sweep run in the checkout (the README's first command) leaves its store, locks,
    Optuna study and artifacts there; a docs build leaves site/. None shows as untracked."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", left_by_a_run], cwd=REPO)
    assert ignored.returncode == 0, f"{left_by_a_run} is not ignored by .gitignore"
