"""The examples/ scripts, as a user from another team would write them: the public API
only (names the README documents), under 60 lines each, and they run end to end in
smoke mode, logging to MLflow the way the built-in studies do."""

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
README = (ROOT / "README.md").read_text()
# The public API is the front door's (README: "Write your own sweep"): examples import nothing else.
PUBLIC_MODULES = ("accelsweep",)


def _public_section() -> str:
    start = README.index("## Write your own sweep")
    return README[start:README.index("\n## ", start + 1)]


def accelsweep_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every accelsweep name the file imports; ``import accelsweep...``
    is refused outright (it reaches everything, public or not)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("accelsweep") for a in node.names), f"{path.name}: use from-imports"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accelsweep"):
            found += [(node.module, alias.name) for alias in node.names]
    return found


def assert_public_imports(path: Path) -> None:
    """Every accelsweep name ``path`` imports is public: its module's ``__all__`` names it."""
    imports = accelsweep_imports(path)
    assert imports, f"{path.name} imports nothing of accelsweep"
    for module, name in imports:
        assert module in PUBLIC_MODULES, f"{path.name}: {module} is not a public module"
        assert name in importlib.import_module(module).__all__, f"{path.name}: {module}.{name} is not public"


def run_smoke(script: Path, tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, str]:
    """``script --smoke --platform cpu`` with its MLflow store and Ray storage in ``tmp_path``;
    it must exit 0. Returns the run and the tracking URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}
    run = subprocess.run([sys.executable, str(script), "--smoke", "--platform", "cpu", "--tracking-uri", uri,
                          "--storage-path", str(tmp_path / "ray"), *flags],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run, uri


def test_there_are_three_examples():
    assert {p.stem for p in EXAMPLES} == {"user_model", "user_trainable", "user_kernel_op"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_an_example_imports_only_documented_public_names(path):
    section = _public_section()
    assert_public_imports(path)
    for module, name in accelsweep_imports(path):
        assert f"`{module}`" in section and re.search(rf"\b{name}\b", section), \
            f"{path.name}: {module}.{name} is not documented in the README's 'Write your own sweep'"
    assert len(path.read_text().splitlines()) < 60, f"{path.name} is 60 lines or more"


def test_the_import_check_finds_a_private_name(tmp_path):
    script = tmp_path / "private.py"
    script.write_text("from accelsweep.trainables.loop.train_loop import _Trial\nimport accelsweep.kernels\n")
    with pytest.raises(AssertionError, match="use from-imports"):
        accelsweep_imports(script)
    script.write_text("from accelsweep.trainables.loop.failures import run_isolated\n"
                      "from accelsweep.trainables.loop.train_loop import _Trial\n")
    imports = accelsweep_imports(script)
    assert imports == [("accelsweep.trainables.loop.failures", "run_isolated"), ("accelsweep.trainables.loop.train_loop", "_Trial")]
    assert "accelsweep.trainables.loop.failures" not in PUBLIC_MODULES
    assert "_Trial" not in importlib.import_module("accelsweep.trainables.loop.train_loop").__all__


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_an_example_runs_and_logs_like_a_built_in_study(path, tmp_path, shared_ray):
    from mlflow.tracking import MlflowClient

    run, uri = run_smoke(path, tmp_path, *shared_ray.flags)
    assert "No trial produced a measurement" not in run.stdout
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name != "Default"]
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "FINISHED" and len(trials) >= 2
    for trial in trials:  # each trial: finished, its config as params, measured figures as metrics
        assert trial.info.status == "FINISHED", trial.data.tags.get("error")
        assert trial.data.params and trial.data.metrics
    assert parent.data.tags["best_trial"] != "none"
    if path.stem == "user_model":  # a workload's own unit: its throughput, and the unit as a tag
        assert all(t.data.tags.get("unit") == "tokens" and t.data.metrics["throughput_tokens_per_s"] > 0
                   for t in trials)
