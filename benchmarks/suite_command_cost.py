"""What a command the test suite starts costs, started as a plain subprocess or forked from
the session's zygote (tests/zygote.py), and where a smoke sweep's CPU goes, by process.

    .venv/bin/python benchmarks/suite_command_cost.py --rounds 4 --out benchmarks/results/suite_command_cost.json

Each round runs each kind once, in turn (A B, then B A), on one Ray instance started as the
test session starts its own (tests/shared_ray.py): the README's main job as the tests run
it (``--smoke --num-samples 2 --confirm-rounds 0``, joined with ``--address``), then a
refused command (``--num-samples 0``: exit 2 before Ray or MLflow is touched). Measured:
wall time, the whole machine's busy CPU time (/proc/stat: Ray's processes are not the
command's children), and the sweep's CPU by process (every process that appeared during it,
polled from /proc: the driver, each Ray worker it caused). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from accelsweep.trainables.contention import read_cpu  # noqa: E402
from tests import shared_ray, zygote  # noqa: E402

KINDS = ("plain", "zygote")
TICK = os.sysconf("SC_CLK_TCK")


class ProcessCpu:
    """The CPU time of every process that appears while it runs, by pid (polled)."""

    def __init__(self):
        self.before = set(self._pids())
        self.seen: dict[int, tuple[float, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    @staticmethod
    def _pids():
        return (int(name) for name in os.listdir("/proc") if name.isdigit())

    def _poll(self):
        while not self._stop.is_set():
            for pid in set(self._pids()) - self.before:
                try:
                    with open(f"/proc/{pid}/stat") as stat:
                        fields = stat.read().rsplit(")", 1)[1].split()
                    cpu = (int(fields[11]) + int(fields[12])) / TICK
                    name = self.seen[pid][1] if pid in self.seen else _role(pid)
                except (OSError, IndexError, ValueError):
                    continue
                self.seen[pid] = (cpu, name)
            time.sleep(0.05)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        roles: dict[str, float] = {}
        for cpu, name in self.seen.values():
            roles[name] = roles.get(name, 0.0) + cpu
        return roles


def _role(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline") as cmdline:
        command = cmdline.read().replace("\0", " ")
    if "neuron_vit.py" in command or "tests.zygote" in command:
        return "driver"
    if "workers/setup_worker.py" in command:
        return "trial worker (runtime env)"
    if "workers/default_worker.py" in command:
        return "other Ray workers"
    return "other"


def one(kind: str, address_flags: list[str], folder: str) -> dict:
    popen = zygote.ZygotePopen if kind == "zygote" else zygote._PlainPopen
    zygote.Zygote.why_plain = ""
    uri = f"sqlite:///{folder}/mlflow.db"
    sweep = [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--num-samples", "2", "--confirm-rounds", "0",
             "--tracking-uri", uri, "--storage-path", os.path.join(folder, "ray"), "--experiment", "cost",
             *address_flags]
    refused = [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--num-samples", "0", "--tracking-uri", uri]
    figures = {}
    for name, command in (("sweep", sweep), ("refused", refused)):
        watch = ProcessCpu() if name == "sweep" else None
        cpu0, t0 = read_cpu(), time.perf_counter()
        with popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
            output = process.stdout.read()
        wall = time.perf_counter() - t0
        time.sleep(1.0)  # what its Ray workers spend ending
        busy = (read_cpu().busy_ticks - cpu0.busy_ticks) / TICK
        if kind == "zygote" and zygote.Zygote.why_plain:
            raise RuntimeError(f"the zygote did not run it: {zygote.Zygote.why_plain}")
        expected = 0 if name == "sweep" else 2
        if process.returncode != expected:
            raise RuntimeError(f"{kind} {name}: exit {process.returncode}:\n{output[-3000:]}")
        figures[name] = {"wall_s": wall, "machine_cpu_s": busy}
        if watch is not None:
            figures[name]["cpu_by_process_s"] = watch.stop()
    return figures


def cpu_name() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default=None, help="JSON record (default: print only)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    zygote.install()  # as tests/conftest.py does (each round picks its Popen itself)
    instance = shared_ray.start()
    figures = {kind: [] for kind in KINDS}
    try:
        zygote.Zygote.get()  # started before the first round: the test session pays it once
        for number in range(args.rounds):
            for kind in KINDS if number % 2 == 0 else tuple(reversed(KINDS)):
                with tempfile.TemporaryDirectory(prefix="command-cost-") as folder:
                    figures[kind].append(one(kind, instance.flags, folder))
                print(f"round {number + 1} {kind}: {json.dumps(figures[kind][-1])}", flush=True)
    finally:
        zygote.Zygote.stop()
        shared_ray.stop(instance)
    medians = {kind: {name: {key: statistics.median(r[name][key] for r in rows)
                             for key in ("wall_s", "machine_cpu_s")} for name in ("sweep", "refused")}
               for kind, rows in figures.items()}
    for kind, rows in figures.items():
        roles = sorted({role for r in rows for role in r["sweep"]["cpu_by_process_s"]})
        medians[kind]["sweep"]["cpu_by_process_s"] = {
            role: statistics.median(r["sweep"]["cpu_by_process_s"].get(role, 0.0) for r in rows) for role in roles}
    print(f"\n{cpu_name()}, {os.cpu_count()} CPUs, {args.rounds} rounds, medians:")
    print("| kind | smoke sweep wall (s) | its machine CPU (s) | refused command wall (s) | its CPU (s) | sweep CPU by process (s) |")
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        m = medians[kind]
        by = ", ".join(f"{role} {cpu:.1f}" for role, cpu in sorted(m["sweep"]["cpu_by_process_s"].items(),
                                                                       key=lambda item: -item[1]) if cpu >= 0.05)
        print(f"| {kind} | {m['sweep']['wall_s']:.1f} | {m['sweep']['machine_cpu_s']:.1f} | "
              f"{m['refused']['wall_s']:.2f} | {m['refused']['machine_cpu_s']:.2f} | {by} |")
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"cpu": cpu_name(), "cpus": os.cpu_count(), "rounds": args.rounds,
                       "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "figures": figures, "medians": medians}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
