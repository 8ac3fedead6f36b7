"""Carry the sweep tool to a lent GPU machine: what it lacks, as wheels, within what travels.

    .venv/bin/python env/gpu_bundle.py build                          # -> .gpu-bundle/
    .venv/bin/python env/gpu_bundle.py build --installed machine-packages.txt
    python3 env/gpu_bundle.py check --bundle .gpu-bundle --site DIR     # there, after installing it

The GPU machine (the device tool's nvidia-h100-x1 and nvidia-h200: Python 3.12, x86-64)
has torch, Triton, JAX and some 200 other packages but no Ray, Optuna or MLflow; it
reaches no registry, and what travels to it, working tree included, is at most 64 MiB.
Ray 2.60's cp312 wheel alone is 79 MB. So ``build``:

1. resolves the tool's own requirements (``TOOL_REQUIREMENTS``, at env/dev-constraints.txt's
   versions, the ones CI tests) for CPython 3.12 on manylinux x86-64 with pip, pinning
   every package the machine has to its version there (``--installed``: the machine's
   ``pip list --format=freeze``; by default env/gpu_machine_packages.txt, that list as
   a lent H100 gave it on 2026-11-26);
2. downloads only what the machine lacks (``--replace NAME`` bundles one it has anyway);
3. re-packs Ray's wheel without the parts a Python-only local sweep never loads
   (``UNUSED``: 35 of its 79 MB), its RECORD rewritten to match, and stores every wheel
   uncompressed inside one ``wheels.tar.xz`` (xz shrinks Ray's executables far more than
   a wheel's deflate does);
4. checks every bundled wheel's requirements against the bundle and the machine, and the
   total against what the working tree leaves of 64 MiB; writes bundle.json beside it.

env/gpu_run.sh unpacks and installs the bundle there (``pip install --no-index --no-deps
--target``) and runs ``check`` before the sweep: a package the list names without a
version is assumed good enough here and verified there.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_INSTALLED = os.path.join(REPO, "env", "gpu_machine_packages.txt")
DEV_CONSTRAINTS = os.path.join(REPO, "env", "dev-constraints.txt")

# What a sweep needs beyond the machine's own stack. mlflow-skinny, not mlflow: the driver
# writes to a sqlite store through MlflowClient (sweeps/driver/record/tracking.py); full mlflow adds
# the UI server, Flask, scikit-learn and more (the UI runs back here, on the store).
TOOL_REQUIREMENTS = ("ray[tune]", "optuna", "mlflow-skinny", "mlflow-tracing", "sqlalchemy", "alembic")

# The machine: CPython 3.12 on x86-64 Linux (KINDS.md: Python 3.12.3). pip matches
# manylinux tags exactly, so each accepted one is named.
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
# Markers of the machine's Python, for the requirement checks (pip evaluates markers for the
# Python that runs it, whatever --python-version says).
TARGET_MARKERS = {"python_version": PYTHON_VERSION, "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython"}

# Parts of a wheel a Python-only local sweep never loads, by distribution, with why.
UNUSED = {
    "ray": {
        "ray/jars/": "Java workers (Ray's cross-language API): Ray starts them only where java and these jars "
                     "exist, and a Python sweep needs none",
        "ray/dashboard/client/build/": "the dashboard's web page: a local sweep starts Ray with "
                                       "include_dashboard=False (sweeps/driver/run/lifecycle.py connect_ray)",
        "ray/rllib/": "RLlib: Tune imports it only to look up a trainable given by name, and takes an "
                      "ImportError as 'not an RLlib trainable' (ray/tune/registry.py)",
    },
}

ARCHIVE, MANIFEST = "wheels.tar.xz", "bundle.json"
MIB = 2**20
CARRY_LIMIT = 64 * MIB  # the device tool: working tree and carried paths together


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- what the machine has -----------------------------------------------------------

_FREEZE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:===?\s*(\S+)|@\s*\S+)?\s*$")
_COLUMNS = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s+(\d\S*)(?:\s+\S.*)?$")


def parse_installed(lines: Iterable[str]) -> dict[str, Optional[str]]:
    """Installed distributions, canonical name -> version (None where only the name is
    known): ``pip list --format=freeze`` lines (``name==1.0``, ``name @ url``), plain
    ``pip list`` columns, or bare names; ``#`` comments and pip's table rules are skipped."""
    installed: dict[str, Optional[str]] = {}
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-") or line.lower().startswith("package "):
            continue
        found = _FREEZE.match(line) or _COLUMNS.match(line)
        if not found:
            raise ValueError(f"not a package line (name==version, name version, or name): {raw.strip()!r}")
        installed[canonical(found.group(1))] = found.group(2)
    return installed


def read_pins(path: str) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by canonical name."""
    with open(path) as lines:
        return {canonical(name): version for name, version in
                (line.split("#", 1)[0].strip().split("==", 1) for line in lines if "==" in line)}


def pinned(requirements: Iterable[str], pins: dict[str, str]) -> list[str]:
    """``ray[tune]`` -> ``ray[tune]==2.60.0`` where the pins have it."""
    out = []
    for requirement in requirements:
        name = canonical(requirement.split("[", 1)[0])
        out.append(f"{requirement}=={pins[name]}" if name in pins else requirement)
    return out


def extras_asked(requirements: Iterable[str]) -> dict[str, set[str]]:
    """``["ray[tune]==2.60.0", "optuna"]`` -> ``{"ray": {"tune"}, "optuna": set()}``."""
    from packaging.requirements import Requirement

    return {canonical(r.name): set(r.extras) for r in map(Requirement, requirements)}


def machine_constraints(installed: dict[str, Optional[str]], replace: Iterable[str] = ()) -> list[str]:
    """Constraints that make pip choose the machine's own version of everything it has a
    known version of: those then need not travel."""
    dropped = {canonical(name) for name in replace}
    return [f"{name}=={version}" for name, version in sorted(installed.items())
            if version is not None and name not in dropped]


# --- resolving -----------------------------------------------------------------------

@dataclass(frozen=True)
class Resolved:
    name: str  # canonical
    version: str
    url: str
    requires: tuple[str, ...]

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def resolve(requirements: list[str], constraints: list[str], python: str, workdir: str) -> list[Resolved]:
    """The full set of distributions pip would install for ``requirements`` on the machine
    (wheels only, CPython 3.12, manylinux x86-64), without installing anything."""
    constraints_file = os.path.join(workdir, "machine-constraints.txt")
    with open(constraints_file, "w") as out:
        out.write("\n".join(constraints) + "\n")
    report = os.path.join(workdir, "report.json")
    command = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", report,
               "--target", os.path.join(workdir, "unused-target"), *_wheel_options(), "-c", constraints_file,
               *requirements]
    _pip(command)
    with open(report) as answer:
        items = json.load(answer)["install"]
    return [Resolved(canonical(item["metadata"]["name"]), item["metadata"]["version"], item["download_info"]["url"],
                     tuple(item["metadata"].get("requires_dist") or ())) for item in items]


def _wheel_options() -> list[str]:
    platforms = [option for platform in PLATFORMS for option in ("--platform", platform)]
    return ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp", "--abi",
            "cp" + PYTHON_VERSION.replace(".", ""), *platforms]


def _pip(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    # pip warns once per package about extra indexes this machine's pip.conf names and
    # that do not exist; keep them out of an error so the real one is seen.
    noise = re.compile(r"^WARNING: Location '.*' is ignored")
    errors = "\n".join(line for line in done.stderr.splitlines() if not noise.match(line))
    if done.returncode != 0:
        raise SystemExit(f"error: pip failed ({' '.join(command[:4])} ...):\n{errors[-4000:]}")


def needed_closure(requirements: list[str], resolved: list[Resolved],
                   on_machine: Callable[[str], bool] = lambda name: False) -> set[str]:
    """The names reachable from ``requirements`` through the resolved distributions'
    requirements, markers evaluated for the machine's Python (pip evaluated them for its
    own, which may be another version). The walk stops at what the machine has: its
    requirements are met there already (pip resolved the newest of one whose version the
    list does not give; the machine's may need less). A reachable name pip did not
    resolve is an error."""
    from packaging.requirements import Requirement

    by_name = {r.name: r for r in resolved}
    wanted: dict[str, set[str]] = {}  # name -> extras asked for
    queue = [Requirement(text) for text in requirements]
    while queue:
        requirement = queue.pop()
        name = canonical(requirement.name)
        extras = set(requirement.extras)
        if name in wanted and extras <= wanted[name]:
            continue
        wanted.setdefault(name, set()).update(extras)
        if name not in by_name:
            raise SystemExit(f"error: {name} is needed on Python {PYTHON_VERSION} but pip, running on "
                             f"{sys.version.split()[0]}, did not resolve it: run this script with a Python "
                             f"{PYTHON_VERSION} (--pip-python)")
        if on_machine(name):
            continue
        for text in by_name[name].requires:
            child = Requirement(text)
            if _applies(child, wanted[name]):
                queue.append(child)
    return set(wanted)


def _applies(requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**TARGET_MARKERS, "extra": extra}) for extra in ("", *extras))


@dataclass(frozen=True)
class Split:
    bundle: list[Resolved]  # to carry
    on_machine: dict[str, Optional[str]]  # name -> the machine's version (None: unknown, assumed)


def split_installed(resolved: list[Resolved], needed: set[str], installed: dict[str, Optional[str]],
                    replace: Iterable[str] = ()) -> Split:
    """What must travel: every needed distribution the machine lacks, or has at another
    version than the one resolved, or that ``replace`` names."""
    replaced = {canonical(name) for name in replace}
    bundle, on_machine = [], {}
    for dist in resolved:
        if dist.name not in needed:
            continue
        if dist.name not in replaced and dist.name in installed and installed[dist.name] in (None, dist.version):
            on_machine[dist.name] = installed[dist.name]
        else:
            bundle.append(dist)
    return Split(bundle, on_machine)


def unmet_requirements(requires_of: dict[str, tuple[list[str], set[str]]],
                       version_of: Callable[[str], Optional[str]]) -> list[str]:
    """Each requirement of each distribution (name -> (its requirement strings, the extras
    asked of it)) that the versions at hand do not meet. ``version_of(name)`` gives a
    version, "" where the name is present at an unknown version (assumed to meet it), or
    None where it is missing."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    problems = []
    for name, (requirements, extras) in sorted(requires_of.items()):
        for text in requirements:
            requirement = Requirement(text)
            if not _applies(requirement, extras):
                continue
            version = version_of(canonical(requirement.name))
            if version is None:
                problems.append(f"{name} needs {text.split(';')[0].strip()}: not installed")
            elif version:
                try:
                    ok = requirement.specifier.contains(Version(version), prereleases=True)
                except InvalidVersion:
                    ok = False
                if not ok:
                    problems.append(f"{name} needs {text.split(';')[0].strip()}: found {version}")
    return problems


# --- re-packing a wheel ---------------------------------------------------------------

def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def slim_wheel(source: str, target: str, unused: dict[str, str],
               compression: int = zipfile.ZIP_DEFLATED) -> dict[str, int]:
    """Copy wheel ``source`` to ``target`` without the files under ``unused``'s prefixes,
    its RECORD rewritten to list exactly what is left, with hashes and sizes, as the wheel
    format requires (pip 26 does not check it; stricter installers and verifiers do).
    Returns the bytes removed per prefix. ``compression``: ZIP_STORED leaves the
    compressing to the archive the bundle travels in."""
    removed = {prefix: 0 for prefix in unused}
    with zipfile.ZipFile(source) as wheel:
        infos = wheel.infolist()
        record_name = next((i.filename for i in infos if re.fullmatch(r"[^/]+\.dist-info/RECORD", i.filename)), None)
        if record_name is None:
            raise SystemExit(f"error: {source} has no .dist-info/RECORD: not a wheel")
        kept_rows = []
        with zipfile.ZipFile(target, "w", compression) as out:
            for info in infos:
                prefix = next((p for p in unused if info.filename.startswith(p)), None)
                if prefix is not None:
                    removed[prefix] += info.compress_size
                    continue
                if info.filename == record_name:
                    continue
                data = wheel.read(info)
                out.writestr(info, data, compress_type=compression)
                if not info.is_dir():
                    kept_rows.append(f"{info.filename},{_record_hash(data)},{len(data)}")
            kept_rows.append(f"{record_name},,")
            out.writestr(record_name, "\n".join(kept_rows) + "\n", compress_type=compression)
    return removed


# --- what travels -----------------------------------------------------------------------

def working_tree_bytes(repo: str = REPO) -> int:
    """What the device tool sends besides carried paths: tracked files and untracked ones
    git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            capture_output=True, check=True).stdout.split(b"\0")
    paths = (os.path.join(repo, os.fsdecode(p)) for p in listed if p)
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p) and not os.path.islink(p))


def pack(wheels: list[str], archive: str, preset: int = 6) -> None:
    """The wheels, flat, in one tar.xz. xz finds far more in the stored wheels' raw
    binaries than zip's deflate does (Ray's three executables are most of the bundle)."""
    with tarfile.open(archive, "w:xz", preset=preset) as out:
        for wheel in wheels:
            out.add(wheel, arcname=os.path.basename(wheel))


def build(args: argparse.Namespace) -> int:
    with open(args.installed) as lines:
        installed = parse_installed(lines)
    replaced = {canonical(name) for name in args.replace}
    requirements = pinned(TOOL_REQUIREMENTS, read_pins(DEV_CONSTRAINTS))
    os.makedirs(args.out, exist_ok=True)
    for old in (ARCHIVE, MANIFEST):  # only what an earlier build wrote
        if os.path.exists(os.path.join(args.out, old)):
            os.remove(os.path.join(args.out, old))
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as work:
        resolved = resolve(requirements, machine_constraints(installed, replaced), args.pip_python, work)
        needed = needed_closure(requirements, resolved, lambda name: name in installed and name not in replaced)
        split = split_installed(resolved, needed, installed, replaced)
        downloads, stored = os.path.join(work, "downloads"), os.path.join(work, "stored")
        os.makedirs(stored)
        _pip([args.pip_python, "-m", "pip", "download", "--quiet", "--no-deps", *_wheel_options(), "-d", downloads,
              *[f"{d.name}=={d.version}" for d in split.bundle]])
        downloaded = {d.filename: os.path.getsize(os.path.join(downloads, d.filename)) for d in split.bundle}
        slimmed = {}
        for dist in split.bundle:
            removed = slim_wheel(os.path.join(downloads, dist.filename), os.path.join(stored, dist.filename),
                                 UNUSED.get(dist.name, {}), compression=zipfile.ZIP_STORED)
            if dist.name in UNUSED:
                slimmed[dist.filename] = removed
        print(f"packing {len(split.bundle)} wheels into {ARCHIVE} (xz: a minute or more)", flush=True)
        pack([os.path.join(stored, d.filename) for d in split.bundle], os.path.join(args.out, ARCHIVE))

    bundled = {d.name: d.version for d in split.bundle}
    extras = extras_asked(requirements)
    requires_of = {d.name: (list(d.requires), extras.get(d.name, set())) for d in split.bundle}
    problems = unmet_requirements(requires_of, lambda name: bundled.get(name) or (
        (installed[name] or "") if name in installed else None))
    archive_bytes = os.path.getsize(os.path.join(args.out, ARCHIVE))
    tree = working_tree_bytes()
    manifest = {
        "python": PYTHON_VERSION, "platforms": list(PLATFORMS), "requirements": requirements,
        "installed_list": os.path.relpath(os.path.abspath(args.installed), REPO),
        "wheels": downloaded, "archive_bytes": archive_bytes, "working_tree_bytes": tree,
        "on_machine": split.on_machine,
        "assumed_on_machine": sorted(n for n, v in split.on_machine.items() if v is None),
        "slimmed": {wheel: {prefix: {"bytes_removed": size, "why": UNUSED[canonical(wheel.split("-")[0])][prefix]}
                            for prefix, size in removed.items()} for wheel, removed in slimmed.items()},
        "unmet": problems,
    }
    with open(os.path.join(args.out, MANIFEST), "w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)
    total = archive_bytes + os.path.getsize(os.path.join(args.out, MANIFEST))

    for wheel, size in sorted(downloaded.items(), key=lambda item: -item[1]):
        print(f"{size / MIB:8.2f} MiB  {wheel}" + ("  (re-packed, below)" if wheel in slimmed else ""))
    for wheel, removed in slimmed.items():
        print(f"re-packed {wheel}: removed " + ", ".join(f"{p} ({b / MIB:.1f} MiB)" for p, b in removed.items()))
    print(f"on the machine already: {len(split.on_machine)} distributions "
          f"({len(manifest['assumed_on_machine'])} at a version the list does not give: checked there)")
    print(f"bundle: {len(downloaded)} wheels, {archive_bytes / MIB:.2f} MiB as {os.path.join(args.out, ARCHIVE)}; "
          f"with the working tree ({tree / MIB:.2f} MiB) {(total + tree) / MIB:.2f} of {CARRY_LIMIT / MIB:.0f} MiB "
          f"travel")
    if problems:
        print("error: requirements the bundle and the machine do not meet:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 1
    if total + tree > CARRY_LIMIT:
        print(f"error: {(total + tree) / MIB:.2f} MiB would travel, over {CARRY_LIMIT / MIB:.0f} MiB", file=sys.stderr)
        return 1
    return 0


def check(args: argparse.Namespace) -> int:
    """On the machine, the bundle installed in ``--site`` (first on sys.path): every
    bundled distribution's requirements met by what this Python sees."""
    import importlib.metadata as metadata

    with open(os.path.join(args.bundle, MANIFEST)) as manifest_file:
        manifest = json.load(manifest_file)
    extras = extras_asked(manifest["requirements"])
    requires_of = {}
    for dist in metadata.distributions(path=[args.site]):
        name = canonical(dist.metadata["Name"])
        requires_of[name] = (list(dist.requires or []), extras.get(name, set()))
    missing = sorted(canonical(w.split("-")[0]) for w in manifest["wheels"]
                     if canonical(w.split("-")[0]) not in requires_of)

    def version_of(name: str) -> Optional[str]:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    problems = [f"{name}: in the bundle but not installed in {args.site}" for name in missing]
    problems += unmet_requirements(requires_of, version_of)
    if problems:
        print("error: the bundle's requirements are not met here:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"bundle check: {len(requires_of)} distributions in {args.site}, every requirement met")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="resolve, download and re-pack the bundle (here)")
    make.add_argument("--installed", default=DEFAULT_INSTALLED,
                      help="the machine's packages: `pip list --format=freeze` output (default: %(default)s)")
    make.add_argument("--out", default=os.path.join(REPO, ".gpu-bundle"), help="bundle folder (default: %(default)s)")
    make.add_argument("--replace", action="append", default=[], metavar="NAME",
                      help="bundle NAME even though the machine has it (a version too old for the tool)")
    make.add_argument("--pip-python", default=sys.executable,
                      help="the Python whose pip resolves and downloads (default: this one)")
    verify = commands.add_parser("check", help="check the installed bundle's requirements (there)")
    verify.add_argument("--bundle", default=os.path.join(REPO, ".gpu-bundle"))
    verify.add_argument("--site", required=True, help="where the bundle was installed (pip --target)")
    args = parser.parse_args(argv)
    if args.command == "build":
        if not os.path.isfile(args.installed):
            parser.error(f"--installed: no such file: {args.installed}")
        return build(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
