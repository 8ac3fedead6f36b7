"""Where a command's CPU goes, every process it starts counted: Linux process accounting
(acct(2): the kernel writes one record per process as it exits, with its user and system
CPU time) while the command runs, and a poller of /proc that keeps each process's command
line (a record has only the first 15 characters of its name). Each process is put in one
kind (a trial, a Ray instance's own process, an MLflow server, a forked command, ...) and
the kinds are printed largest first. The accounting is the machine's: a process of
anything else that ends meanwhile is counted too (run it on a quiet machine). Root only
(CAP_SYS_PACCT); Linux only.

    python benchmarks/suite_cpu_by_process.py --out /tmp/pass -- \\
        .venv/bin/python -m pytest -n 2 --dist loadfile -m "not xla and not (host_timing or alone)"
    python benchmarks/suite_cpu_by_process.py --read /tmp/pass      # the table again

benchmarks/results/test_suite.md (the eleventh run) has what it found for the parallel pass.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import threading
import time

# struct acct_v3 (linux/acct.h): flag, version, tty, exit code, uid, gid, pid, ppid, start
# time (s), elapsed (float, ticks), then comp_t utime, stime, mem, io, rw, minflt, majflt,
# swaps, and the name.
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
TICKS_PER_S = 100  # AHZ: comp_t times are in these on every Linux architecture
POLL_S = 0.3


def _comp_t(value: int) -> int:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_records(path: str) -> list[dict]:
    data = open(path, "rb").read()
    records = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        fields = RECORD.unpack_from(data, offset)
        if fields[1] & 0x0F != 3:  # another layout (a kernel without BSD_PROCESS_ACCT_V3): same size, other fields
            raise SystemExit(f"{path}: acct record version {fields[1] & 0x0F}, not 3")
        records.append({"pid": fields[6], "ppid": fields[7], "started": fields[8],
                        "cpu_s": (_comp_t(fields[10]) + _comp_t(fields[11])) / TICKS_PER_S,
                        "name": fields[18].split(b"\0")[0].decode(errors="replace")})
    return records


def kind_of(name: str, command: str, parent_command: str) -> str:
    """One kind per process, from its name (Ray's workers name themselves ``ray::Actor``),
    its command line and its parent's."""
    if name.startswith(("ray::ImplicitFu", "ray::RayTrainWo")) or "fresh_process" in command or name == "pt_data_worker":
        return "trials (Tune's function actors, fresh-process trials, loader workers)"
    if command.split(" -m ")[-1].startswith(("mlflow server", "uvicorn")) or (
            "multiprocessing.spawn" in command and "uvicorn" in parent_command):
        return "MLflow servers (the mlflow server command, uvicorn, its spawned workers)"
    if name.startswith("ray::") and name not in ("ray::DashboardA", "ray::RuntimeEnv", "ray::IDLE"):
        return "other Ray actors"
    if name in ("ray::DashboardA", "ray::RuntimeEnv", "ray::IDLE", "raylet", "gcs_server", "ray") or any(
            part in command for part in ("dashboard", "monitor.py", "ray.scripts", "local_ray")):
        return "Ray instances' own processes"
    if "exec(eval(sys.s" in command:
        return "pytest-xdist workers (tests run in-process)"
    if "serve_commands" in command or "serve_workers" in command:
        forked = "serve_commands" in parent_command or "serve_workers" in parent_command
        return "commands forked from the test zygote" if forked else "the zygotes' own imports"
    if "pytest" in command:
        return "pytest (main process, nested runs)"
    if name.startswith("python") or name == "accelsweep":
        return "plain Python commands"
    return "other programs (" + name + ")" if name in ("postgres", "chromium", "cc1plus") else "other programs"


def table(folder: str) -> list[tuple[str, float, int]]:
    # A pid is used again by later processes (thousands start in a pass): a record's command
    # line is the one of its pid's process that started closest to when the record says.
    commands: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    with open(os.path.join(folder, "commands.jsonl")) as lines:
        for line in lines:
            pid, started, command = json.loads(line)
            commands[pid].append((started, command))

    def command_of(pid: int, started: float) -> str:
        found = min(commands.get(pid, ()), key=lambda entry: abs(entry[0] - started), default=None)
        return found[1] if found is not None and abs(found[0] - started) <= 2 else ""

    cpu, count = collections.Counter(), collections.Counter()
    for record in read_records(os.path.join(folder, "pacct")):
        # Its parent: the latest process of that pid started before it.
        parents = [entry for entry in commands.get(record["ppid"], ()) if entry[0] <= record["started"] + 2]
        parent = max(parents, default=(0.0, ""))[1]
        kind = kind_of(record["name"], command_of(record["pid"], record["started"]), parent)
        cpu[kind] += record["cpu_s"]
        count[kind] += 1
    return [(kind, seconds, count[kind]) for kind, seconds in cpu.most_common()]


def _poll_commands(path: str, stop: threading.Event) -> None:
    booted = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime "))
    ticks = os.sysconf("SC_CLK_TCK")
    seen = set()
    with open(path, "a") as out:
        while not stop.wait(POLL_S):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    # Field 22 of stat, after the name in parentheses: the start, in ticks since boot.
                    since_boot = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[19])
                    if (int(entry), since_boot) in seen:
                        continue
                    command = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
                except (OSError, IndexError, ValueError):
                    continue
                if command:
                    seen.add((int(entry), since_boot))
                    out.write(json.dumps([int(entry), booted + since_boot / ticks, command[:300]]) + "\n")
            out.flush()


def run(folder: str, command: list[str]) -> int:
    os.makedirs(folder, exist_ok=True)
    pacct = os.path.join(folder, "pacct")
    open(pacct, "wb").close()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(pacct.encode()) != 0:
        raise SystemExit(f"acct({pacct}) failed: {os.strerror(ctypes.get_errno())} (root only)")
    stop = threading.Event()
    poller = threading.Thread(target=_poll_commands, args=(os.path.join(folder, "commands.jsonl"), stop), daemon=True)
    poller.start()
    started = time.monotonic()
    try:
        status = subprocess.call(command)
    finally:
        libc.acct(None)
        stop.set()
        poller.join()
    print(f"{' '.join(command)}: exit {status}, {time.monotonic() - started:.0f} s")
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the records (pacct, commands.jsonl)")
    parser.add_argument("--read", help="a folder an earlier run wrote: print its table")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    folder = args.read or args.out
    if folder is None or (args.read is None and not args.command):
        parser.error("--out FOLDER -- COMMAND..., or --read FOLDER")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    status = 0 if args.read else run(folder, command)
    rows = table(folder)
    total = sum(seconds for _, seconds, _ in rows)
    print(f"{total:.0f} CPU-s in the records of {sum(n for _, _, n in rows)} processes")
    for kind, seconds, number in rows:
        print(f"{seconds:8.1f} {100 * seconds / total:5.1f}% {number:6d}  {kind}")
    sys.exit(status)


if __name__ == "__main__":
    main()
