"""The process table, read from /proc (proc(5)): the one reader every part of the tool
uses (the driver's trial deadline and local Ray reaper, the tool-cost benchmark's
neighbour watch). Linux only; elsewhere the table is empty and a pid's stat None.

``/proc/<pid>/stat`` is "pid (comm) state ppid ...": comm may hold spaces and
parentheses, so the fields are read after its last ")".
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping, NamedTuple, Optional


class ProcessStat(NamedTuple):
    parent: int
    state: str  # R, S, D, Z, T, ...
    cpu_ticks: int  # user + system time used so far, in clock ticks (os.sysconf("SC_CLK_TCK") a second)
    started: int  # clock ticks after boot: with the pid, it names one process even after the pid is reused
    name: str  # comm: the executable's name, at most 15 characters


def stat_of(pid: int) -> Optional[ProcessStat]:
    """The process's /proc/<pid>/stat; None when it has ended (or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            head, tail = stat.read().rsplit(")", 1)
        fields = tail.split()
        return ProcessStat(parent=int(fields[1]), state=fields[0], cpu_ticks=int(fields[11]) + int(fields[12]),
                           started=int(fields[19]), name=head.split("(", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def process_table(include_zombies: bool = True) -> dict[int, ProcessStat]:
    """pid -> stat of every live process this user can read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    table = {}
    for entry in entries:
        if entry.isdigit():
            stat = stat_of(int(entry))
            if stat is not None and (include_zombies or stat.state != "Z"):
                table[int(entry)] = stat
    return table


def command_line(pid: int) -> Optional[list[str]]:
    """The process's arguments; None when it has ended or is not this user's to read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None


def open_paths(pid: int) -> list[str]:
    """What the process's file descriptors point at (files, sockets, pipes)."""
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []  # ended, or another user's
    paths = []
    for descriptor in descriptors:
        try:
            paths.append(os.readlink(f"/proc/{pid}/fd/{descriptor}"))
        except OSError:
            continue  # closed meanwhile
    return paths


def children_by_parent(table: Mapping[int, ProcessStat]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat.parent, []).append(pid)
    return children


def descendants(table: Mapping[int, ProcessStat], roots: Iterable[int], exclude: Iterable[int] = ()) -> set[int]:
    """``roots`` and every process below them in ``table``; ``exclude``d pids are left
    out with what is below them."""
    children = children_by_parent(table)
    skipped = set(exclude)
    found: set[int] = set()
    todo = [pid for pid in roots if pid not in skipped]
    while todo:
        pid = todo.pop()
        if pid not in found and pid not in skipped:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found
