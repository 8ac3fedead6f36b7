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
from typing import NamedTuple

import pytest

from tests.conftest import REPO

ROOTS = ("sweeps", "trainables", "kernels")  # installed as accelsweep.<root>
# Named as they are: the front door (accelsweep/), and the benchmarks run from the checkout.
PLAIN_ROOTS = ("accelsweep", "benchmarks")
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
    return ".".join(parts if parts[0] in PLAIN_ROOTS else ["accelsweep", *parts])


def _source_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _files((".py",)) if p.relative_to(REPO).parts[0] in ROOTS + PLAIN_ROOTS}


def test_module_names_follow_the_install():
    assert _module_name(Path(REPO, "accelsweep", "__init__.py")) == "accelsweep"
    assert _module_name(Path(REPO, "accelsweep", "_moved.py")) == "accelsweep._moved"
    assert _module_name(Path(REPO, "trainables", "loop", "__init__.py")) == "accelsweep.trainables.loop"
    assert _module_name(Path(REPO, "benchmarks", "search_efficiency.py")) == "benchmarks.search_efficiency"


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


class Import(NamedTuple):
    module: str  # the module the import statement is in
    target: str  # the module it imports
    path: Path
    line: int
    in_function: bool


def _in_function(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def imports() -> list[Import]:
    """Every import of one of the tree's modules by another, at module level or inside a
    function. Imports under ``if TYPE_CHECKING:`` never run and are left out."""
    modules = _source_modules()
    found = []
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
            found += [Import(name, target, path, node.lineno, _in_function(node, parents))
                      for target in dict.fromkeys(targets) if target in modules and target != name]
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports, at module level or inside functions
    (a lazy import still closes a circle; it only hides it until run time)."""
    graph: dict[str, set[str]] = {name: set() for name in _source_modules()}
    for found in imports():
        graph[found.module].add(found.target)
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
    # loop/train_loop.py imports nan_capture (torch) inside a function only.
    loop, capture = "accelsweep.trainables.loop.train_loop", "accelsweep.trainables.loop.nan_capture"
    found = [i for i in imports() if (i.module, i.target) == (loop, capture)]
    assert found and all(i.in_function for i in found)
    assert capture in import_graph()[loop]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (break them; a lazy import only hides one):\n" + "\n".join(
        " <-> ".join(c) for c in found)


# Split into one node per subpackage plus one for their own top-level modules; every other
# root is one node (accelsweep, accelsweep.kernels, accelsweep.sweeps, benchmarks).
SPLIT_PACKAGES = ("accelsweep.sweeps.driver", "accelsweep.trainables")
# trainables/ holds one module per idea at its top: each is a node of its own, so that a
# leaf (errors, metrics, precision) and an entry (config, trainable) do not merge into one.
MODULES_AS_NODES = ("accelsweep.trainables",)
# Imports that run against the layers: module -> (the packages it imports against them, why).
# The package graph leaves these edges out; every other import runs one way. An entry that
# no longer occurs fails test_package_layers_run_one_way: take it off the list.
AGAINST_THE_LAYERS: dict[str, tuple[tuple[str, ...], str]] = {}


def package_of(module: str, modules: dict[str, Path]) -> str:
    """The node a module belongs to in the package graph (SPLIT_PACKAGES)."""
    for split in SPLIT_PACKAGES:
        if module == split or module.startswith(split + "."):
            sub = ".".join(module.split(".")[:len(split.split(".")) + 1])
            if sub in modules and modules[sub].name == "__init__.py":
                return sub
            return sub if split in MODULES_AS_NODES and module != split else split
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "accelsweep" and len(parts) > 1 and parts[1] in ROOTS else parts[0]


def package_graph(graph: dict[str, set[str]], modules: dict[str, Path], left_out=()) -> dict[str, dict[str, set]]:
    """Package -> the packages it imports -> the (module, module) imports behind each edge."""
    packages: dict[str, dict[str, set]] = {}
    for module, targets in graph.items():
        source = package_of(module, modules)
        packages.setdefault(source, {})
        for target in targets:
            into = package_of(target, modules)
            if into != source and (module, into) not in left_out:
                packages[source].setdefault(into, set()).add((module, target))
    return packages


def test_package_of():
    modules = _source_modules()
    assert package_of("accelsweep.trainables.loop.train_loop", modules) == "accelsweep.trainables.loop"
    assert package_of("accelsweep.trainables.loop", modules) == "accelsweep.trainables.loop"
    assert package_of("accelsweep.trainables.config", modules) == "accelsweep.trainables.config"
    assert package_of("accelsweep.trainables.timing.windows", modules) == "accelsweep.trainables.timing"
    assert package_of("accelsweep.sweeps.driver.run.lifecycle", modules) == "accelsweep.sweeps.driver.run"
    assert package_of("accelsweep.sweeps.driver.console", modules) == "accelsweep.sweeps.driver"
    assert package_of("accelsweep.sweeps.neuron_vit", modules) == "accelsweep.sweeps"
    assert package_of("accelsweep.kernels.giou.torch_impl", modules) == "accelsweep.kernels"
    assert package_of("accelsweep._moved", modules) == "accelsweep"
    assert package_of("benchmarks.search_efficiency", modules) == "benchmarks"


def test_package_layers_run_one_way():
    """The graph collapsed to packages (SPLIT_PACKAGES) has no circles: a package that
    imports another is never imported by it, not even through a third, and what two
    packages share lives in the lower one."""
    modules = _source_modules()
    graph = import_graph()
    listed = {(module, package) for module, (packages, _) in AGAINST_THE_LAYERS.items() for package in packages}
    packages = package_graph(graph, modules, left_out=listed)
    found = circles({source: set(targets) for source, targets in packages.items()})
    detail = []
    for circle in found:
        for source in circle:
            for target in circle:
                for module, imported in sorted(packages[source].get(target, ())):
                    detail.append(f"  {source} -> {target}: {module} imports {imported}")
    assert not found, "package circles:\n" + "\n".join(" <-> ".join(c) for c in found) + "\n" + "\n".join(detail)
    everything = package_graph(graph, modules)
    stale = [edge for edge in sorted(listed)
             if not any(module == edge[0] for module, _ in everything[package_of(edge[0], modules)].get(edge[1], ()))]
    assert not stale, f"listed in AGAINST_THE_LAYERS but no longer imported (take them off): {stale}"


# Modules imported inside functions without a comment: each brings a heavy stack at import,
# which its importer must not load before it needs it (module -> what it brings).
LAZY_BY_NATURE: dict[str, str] = {
    "accelsweep.trainables.loop.nan_capture": "torch",
    "accelsweep.trainables.workloads.random_images": "torch",
    "accelsweep.trainables.platforms.neuron_backend": "Ray Train's torch-xla backend",
}


def test_every_import_inside_a_function_says_why():
    """An import of the tree's own module inside a function is there for a reason the
    reader can see: an optional stack (JAX, torch-xla, Neuron, Triton), or a start-up cost
    (a trial's process, or a script that a trial imports, loads no Ray Tune, MLflow,
    Optuna or torch before it needs them). The reason is a comment on its line or the line
    above, or the module is in LAZY_BY_NATURE. Hiding an import circle is no reason: move
    what both sides share down instead."""
    unexplained = []
    for found in imports():
        if not found.in_function or found.target in LAZY_BY_NATURE:
            continue
        lines = found.path.read_text().splitlines()
        here, above = lines[found.line - 1], lines[found.line - 2].strip()
        if "#" not in here and not above.startswith("#"):
            unexplained.append(f"{found.path.relative_to(REPO)}:{found.line}: {found.target}")
    assert not unexplained, "imports inside functions without a reason:\n" + "\n".join(unexplained)


@pytest.mark.parametrize("root", ROOTS + PLAIN_ROOTS)
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
              for module, targets in graph.items()
              if module.startswith(("accelsweep.trainables", "accelsweep.kernels"))}
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
