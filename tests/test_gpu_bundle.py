"""env/gpu_bundle.py and env/gpu_run.sh, without a network or a GPU: the machine's package
list is read, what it has is left out, the closure is walked for the machine's Python,
a re-packed wheel keeps a RECORD pip accepts, and a whole build runs on fake wheels
(pip's resolving and downloading replaced). The real build (PyPI, Ray's 79 MB wheel) and
the real run (a GPU machine) are not run here; the README says what was."""

import base64
import hashlib
import importlib.util
import json
import os
import stat
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("gpu_bundle", os.path.join(REPO, "env", "gpu_bundle.py"))
gpu_bundle = importlib.util.module_from_spec(spec)
sys.modules["gpu_bundle"] = gpu_bundle  # dataclasses look their module up there
spec.loader.exec_module(gpu_bundle)
Resolved = gpu_bundle.Resolved


def make_wheel(folder, name="fakepkg", version="1.0", files=None, requires=(), executable=()):
    """A wheel as pip builds them: files, METADATA, WHEEL and a RECORD of them all."""
    files = files or {f"{name}/__init__.py": b"VALUE = 1\n", f"{name}/jars/big.jar": b"\0" * 4096,
                      f"{name}/keep/data.txt": b"kept\n"}
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {**files, f"{info}/METADATA": metadata.encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    path = os.path.join(folder, f"{name}-{version}-py3-none-any.whl")
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for file, data in files.items():
            entry = zipfile.ZipInfo(file, date_time=(2026, 1, 1, 0, 0, 0))
            entry.external_attr = ((0o755 if file in executable else 0o644) | stat.S_IFREG) << 16
            wheel.writestr(entry, data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{file},sha256={digest},{len(data)}")
        wheel.writestr(f"{info}/RECORD", "\n".join(rows + [f"{info}/RECORD,,"]) + "\n")
    return path


# --- the machine's list --------------------------------------------------------------

def test_the_installed_list_takes_freeze_columns_and_bare_names():
    lines = ["# a comment", "numpy==2.5.2", "Pandas == 2.2.3  # trailing", "torch @ file:///wheels/torch.whl",
             "typing_extensions===4.12.2", "Package    Version", "---------- -------", "PyYAML     6.0.2",
             "cupy-cuda13x", "", "ray[tune]==2.60.0"]
    assert gpu_bundle.parse_installed(lines) == {"numpy": "2.5.2", "pandas": "2.2.3", "torch": None,
                                                 "typing-extensions": "4.12.2", "pyyaml": "6.0.2",
                                                 "cupy-cuda13x": None, "ray": "2.60.0"}
    with pytest.raises(ValueError, match="not a package line .*'numpy >= 2'"):
        gpu_bundle.parse_installed(["numpy >= 2"])


def test_the_default_list_is_the_machines_own_and_pins_every_version():
    """env/gpu_machine_packages.txt is the H100 machine's pip freeze (2026-11-26): with names
    alone the bundle took a databricks-sdk that needs a newer certifi than the machine has."""
    with open(gpu_bundle.DEFAULT_INSTALLED) as lines:
        installed = gpu_bundle.parse_installed(lines)
    assert installed["torch"] == "2.11.0" and installed["numpy"] == "2.5.2"
    assert installed["certifi"] == "2026.7.22" and None not in installed.values()
    assert not {"ray", "optuna", "mlflow", "mlflow-skinny", "sqlalchemy", "alembic"} & set(installed)
    assert gpu_bundle.machine_constraints({"numpy": "2.5.2", "pandas": None, "protobuf": "5.0"}, ["Protobuf"]) == [
        "numpy==2.5.2"]


def test_the_tools_requirements_are_pinned_to_the_versions_ci_tests():
    pins = gpu_bundle.read_pins(gpu_bundle.DEV_CONSTRAINTS)
    requirements = gpu_bundle.pinned(gpu_bundle.TOOL_REQUIREMENTS, pins)
    assert requirements[0] == f"ray[tune]=={pins['ray']}" and f"optuna=={pins['optuna']}" in requirements
    assert gpu_bundle.extras_asked(requirements)["ray"] == {"tune"}


# --- what travels ---------------------------------------------------------------------

def resolved(name, version="1.0", *requires):
    return Resolved(name, version, f"https://example.invalid/{name}-{version}-py3-none-any.whl", requires)


RESOLVED = [
    resolved("tool", "1.0", "base>=2", "shared", 'extra-dep; extra == "x"', 'old-python-only; python_version < "3.12"',
             'other-extra; extra == "y"'),
    resolved("base", "2.1", "base-dep"),  # on the machine at an unknown version: its needs are met there
    resolved("base-dep", "1.0"),
    resolved("shared", "3.0"),  # on the machine, but at 2.0: travels
    resolved("extra-dep", "1.0"),
    resolved("old-python-only", "1.0"),  # pip ran on 3.11; the machine's 3.12 does not need it
    resolved("other-extra", "1.0"),
]


def test_only_what_the_machine_lacks_travels_and_the_walk_is_for_its_python():
    installed = {"base": None, "shared": "2.0", "unrelated": "1.0"}
    needed = gpu_bundle.needed_closure(["tool[x]==1.0"], RESOLVED, lambda name: name in installed)
    assert needed == {"tool", "base", "shared", "extra-dep"}
    split = gpu_bundle.split_installed(RESOLVED, needed, installed)
    assert [d.name for d in split.bundle] == ["tool", "shared", "extra-dep"] and split.on_machine == {"base": None}
    replaced = gpu_bundle.split_installed(RESOLVED, needed, installed, replace=["Base"])
    assert "base" in [d.name for d in replaced.bundle]


def test_a_need_pip_did_not_resolve_asks_for_the_machines_python():
    with pytest.raises(SystemExit, match="run this script with a Python 3.12 .--pip-python."):
        gpu_bundle.needed_closure(["tool"], [resolved("tool", "1.0", 'new-python-only; python_version >= "3.12"')])


def test_requirements_are_checked_against_the_bundle_and_the_machine():
    versions = {"base": "1.5", "shared": "", "extra-dep": "1.0"}  # "": present, version unknown
    problems = gpu_bundle.unmet_requirements({"tool": (list(RESOLVED[0].requires), {"x"})}, versions.get)
    assert problems == ["tool needs base>=2: found 1.5"]
    assert gpu_bundle.unmet_requirements({"tool": (["gone>=1"], set())}, versions.get) == [
        "tool needs gone>=1: not installed"]


def test_a_repacked_wheel_loses_the_unused_parts_and_keeps_a_record_pip_installs(tmp_path):
    source = make_wheel(str(tmp_path), executable=("fakepkg/keep/data.txt",))
    for compression in (zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED):
        target = str(tmp_path / f"slim-{compression}" / os.path.basename(source))
        os.makedirs(os.path.dirname(target))
        removed = gpu_bundle.slim_wheel(source, target, {"fakepkg/jars/": "Java"}, compression=compression)
        assert removed["fakepkg/jars/"] > 0
        with zipfile.ZipFile(target) as wheel:
            names = set(wheel.namelist())
            assert "fakepkg/jars/big.jar" not in names and "fakepkg/keep/data.txt" in names
            assert {i.compress_type for i in wheel.infolist()} == {compression}
            rows = wheel.read("fakepkg-1.0.dist-info/RECORD").decode().splitlines()
            listed = {row.split(",")[0]: row.split(",", 1)[1] for row in rows}
            assert set(listed) == names  # every file listed, nothing removed still named
            for name, hash_and_size in listed.items():
                if name.endswith("RECORD"):
                    assert hash_and_size == ","
                    continue
                data = wheel.read(name)
                assert hash_and_size == f"{gpu_bundle._record_hash(data)},{len(data)}"
    # pip installs it offline, without the jar, with the file modes kept.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), target], check=True, capture_output=True)
    assert (site / "fakepkg" / "keep" / "data.txt").read_text() == "kept\n"
    assert not (site / "fakepkg" / "jars").exists()
    assert os.stat(site / "fakepkg" / "keep" / "data.txt").st_mode & 0o111


def test_a_build_on_fake_wheels_writes_the_archive_and_the_manifest(tmp_path, monkeypatch, capsys):
    """The whole build, pip's resolver and downloads replaced by fakes: what the machine
    has stays out, Ray-like parts are cut, the budget is checked."""
    wheels = tmp_path / "index"
    wheels.mkdir()
    made = {"tool": make_wheel(str(wheels), "tool", "1.0", requires=["base", "shared>=3"]),
            "shared": make_wheel(str(wheels), "shared", "3.0", files={"shared/__init__.py": b""})}
    fake_resolved = [Resolved("tool", "1.0", "https://example.invalid/" + os.path.basename(made["tool"]),
                              ("base", "shared>=3")),
                     Resolved("base", "2.0", "https://example.invalid/base-2.0-py3-none-any.whl", ()),
                     Resolved("shared", "3.0", "https://example.invalid/" + os.path.basename(made["shared"]), ())]
    asked = {}

    def fake_resolve(requirements, constraints, python, workdir):
        asked.update(requirements=requirements, constraints=constraints)
        return fake_resolved

    def fake_pip(command):
        assert "download" in command and "--no-deps" in command
        folder = command[command.index("-d") + 1]
        os.makedirs(folder, exist_ok=True)
        for name in ("tool", "shared"):
            assert f"{name}==1.0" in command or f"{name}==3.0" in command
            with open(made[name], "rb") as source, open(os.path.join(folder, os.path.basename(made[name])), "wb") as out:
                out.write(source.read())

    monkeypatch.setattr(gpu_bundle, "resolve", fake_resolve)
    monkeypatch.setattr(gpu_bundle, "_pip", fake_pip)
    monkeypatch.setattr(gpu_bundle, "TOOL_REQUIREMENTS", ("tool",))
    monkeypatch.setattr(gpu_bundle, "UNUSED", {"tool": {"tool/jars/": "Java workers"}})
    installed = tmp_path / "machine.txt"
    installed.write_text("base==2.0\nshared==2.0\n")
    out = tmp_path / "bundle"
    assert gpu_bundle.main(["build", "--installed", str(installed), "--out", str(out)]) == 0
    assert asked["constraints"] == ["base==2.0", "shared==2.0"] and asked["requirements"] == ["tool"]
    manifest = json.loads((out / "bundle.json").read_text())
    assert sorted(manifest["wheels"]) == sorted(os.path.basename(p) for p in made.values())
    assert manifest["on_machine"] == {"base": "2.0"} and manifest["unmet"] == []
    assert manifest["slimmed"][os.path.basename(made["tool"])]["tool/jars/"]["why"] == "Java workers"
    with tarfile.open(out / "wheels.tar.xz") as archive:
        assert sorted(archive.getnames()) == sorted(manifest["wheels"])
        with zipfile.ZipFile(archive.extractfile(os.path.basename(made["tool"]))) as wheel:
            assert "tool/jars/big.jar" not in wheel.namelist()
            assert {i.compress_type for i in wheel.infolist()} == {zipfile.ZIP_STORED}
    assert "of 64 MiB travel" in capsys.readouterr().out

    monkeypatch.setattr(gpu_bundle, "CARRY_LIMIT", 1000)
    assert gpu_bundle.main(["build", "--installed", str(installed), "--out", str(out)]) == 1
    assert "would travel, over" in capsys.readouterr().err


def test_the_check_there_finds_an_unmet_requirement(tmp_path, monkeypatch, capsys):
    """``check`` on the machine: the installed bundle's requirements against what its
    Python sees (here a target folder put first on sys.path)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    paths = [make_wheel(str(folder), "tool", "1.0", requires=["helper>=2"], files={"tool/__init__.py": b""}),
             make_wheel(str(folder), "helper", "1.5", files={"helper/__init__.py": b""})]
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *paths], check=True, capture_output=True)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.json").write_text(json.dumps({"requirements": ["tool"], "wheels": {
        os.path.basename(p): 1 for p in paths}}))
    monkeypatch.syspath_prepend(str(site))
    assert gpu_bundle.main(["check", "--bundle", str(bundle), "--site", str(site)]) == 1
    assert "tool needs helper>=2: found 1.5" in capsys.readouterr().err


# --- the run script's refusals (it runs for real only on a GPU machine) ----------------------

@pytest.mark.parametrize("arguments, environment, message", [
    ([], {"OUT": "."}, "name the sweep"),
    (["sweeps/giou_kernels.py"], {"OUT": ""}, "$OUT is not a folder"),
    (["sweeps/giou_kernels.py"], {"OUT": ".", "GPU_BUNDLE": "/nonexistent"}, "no bundle in /nonexistent"),
])
def test_the_run_script_says_what_is_missing(tmp_path, arguments, environment, message):
    environment = {**os.environ, **{k: (str(tmp_path) if v == "." else v) for k, v in environment.items()}}
    done = subprocess.run(["bash", os.path.join(REPO, "env", "gpu_run.sh"), *arguments], env=environment,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_the_run_script_keeps_the_store_flags_to_itself(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "wheels.tar.xz").write_bytes(b"")
    (bundle / "bundle.json").write_text("{}")
    done = subprocess.run(["bash", os.path.join(REPO, "env", "gpu_run.sh"), "sweeps/giou_kernels.py",
                           "--tracking-uri", "sqlite:///x.db"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path), "GPU_BUNDLE": str(bundle)})
    assert done.returncode == 2 and "--tracking-uri is set by env/gpu_run.sh" in done.stderr
