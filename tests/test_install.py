"""accelsweep installed beside another distribution that owns a top-level ``kernels``
(Hugging Face's ``kernels``, which transformers installs, is one): as a wheel and as the
README's editable install, in a scratch venv, a kernel study still finds our ops.

The scratch venv sees this venv's packages (torch, Ray, ...) through a path file, so
nothing heavy is installed again; accelsweep and the stand-in are installed into it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

STAND_IN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=77"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "stand-in-kernels"
        version = "1.0"
        [tool.setuptools]
        packages = ["kernels", "kernels.activation"]
    """,
    "kernels/__init__.py": "STAND_IN = 'stand-in kernels'\n",
    "kernels/activation/__init__.py": "",  # a subpackage our op list must not pick up
}


def _run(command: list[str], cwd: Path, env=None) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n" \
                                 f"{done.stderr[-3000:]}"
    return done


def _scratch_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # A plain path line: this venv's packages become importable, but its own .pth files
    # (among them the editable accelsweep's finder) are not run.
    Path(purelib, "this-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _pip(python: Path, *args: str) -> None:
    _run([sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "--quiet",
          "install", "--no-deps", *args], cwd=Path(REPO))


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stand-in")
    for name, text in STAND_IN.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def _clean_copy(destination: Path) -> Path:
    """What a wheel is built from: the tracked layout, without this checkout's build/
    leftovers (setuptools would ship stale files from an old build/lib)."""
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(os.path.join(REPO, name), destination / name)
    for root in ("accelsweep", "sweeps", "trainables", "kernels"):  # the front door and the three folders
        shutil.copytree(os.path.join(REPO, root), destination / root,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return destination


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["wheel", "editable"])
def test_a_kernel_study_runs_beside_another_top_level_kernels(mode, stand_in, tmp_path):
    python = _scratch_venv(tmp_path / "venv")
    _pip(python, str(stand_in))
    if mode == "editable":
        _pip(python, "-e", REPO)
    else:
        (tmp_path / "source").mkdir()
        _pip(python, str(_clean_copy(tmp_path / "source")))
    elsewhere = tmp_path / "cwd"  # not the repository root, as a user's shell would be
    elsewhere.mkdir()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}

    # The study as the README runs it (its folder first on sys.path), and as an installed module.
    for command in ([str(python), os.path.join(REPO, "sweeps", "giou_kernels.py"), "--dry-run"],
                    [str(python), "-m", "accelsweep.sweeps.giou_kernels", "--dry-run"]):
        out = _run(command + ["--tracking-uri", f"sqlite:///{tmp_path}/m.db"], cwd=elsewhere, env=env).stdout
        assert "sweep 'giou_kernels'" in out and "torch-naive" in out, out

    probe = _run([str(python), "-c", "import kernels, accelsweep.kernels.registry as r, accelsweep.kernels as k; "
                                     "import accelsweep; assert accelsweep.OpSpec is r.OpSpec; "
                                     "print(kernels.STAND_IN, r.OPS, k.__file__)"], cwd=elsewhere).stdout
    assert "stand-in kernels" in probe and "'activation'" not in probe and "'giou'" in probe, probe
    ours = Path(probe.split()[-1]).parent
    if mode == "wheel":
        # Installed, not read from the repository: with the files the code reads.
        assert not str(ours).startswith(REPO), ours
        assert (ours / "giou" / "gpsimd" / "giou.cpp").is_file()
        _run([sys.executable, "-m", "pip", "--python", str(python), "uninstall", "--yes", "accelsweep"],
             cwd=elsewhere)
        kept = _run([str(python), "-c", "import kernels; print(kernels.STAND_IN)"], cwd=elsewhere).stdout
        assert "stand-in kernels" in kept  # uninstalling us left the other package whole
    else:
        assert str(ours) == os.path.join(REPO, "kernels")
