"""What neuronx-cc said when it failed, instead of torch-xla's "compilation failed".

When a graph fails to compile, the Python exception a trial sees carries no reason:
``INTERNAL: neuronx-cc compilation failed.`` (or ``neuronx-cc failed with 1``). The
reason is in the compiler's own log, ``log-neuron-cc.txt`` in its work directory
(``/tmp/<user>/neuroncc_compile_workdir/<uuid>/``), in lines such as

    2023-06-15T12:11:12Z ERROR 85724 [neuronx-cc]: [NCC_EVRF009] ... message ...
    2022-11-22 19:07:46.000353: ERROR ||NCC_WRAPPER||: There was a compilation error ...

This module finds the logs a trial's compiles wrote and keeps the lines that explain
the failure (error codes and messages, not the Python traceback or version banner).
Written against logs quoted in aws-neuron-sdk issues; never run against a live
compiler here (there is no Neuron hardware or compiler on our machines).
"""

from __future__ import annotations

import getpass
import glob
import os
import re
from typing import Iterable, Optional

FAILURE_MARKERS = ("neuronx-cc compilation failed", "neuronx-cc failed", "neuronx-cc terminated abnormally",
                   "compilation error for this graph")
LOG_NAME = "log-neuron-cc.txt"
MAX_LINES = 6

_ERROR_LINE = re.compile(r"\bERROR\b.*?(?:\[neuronx-cc\]|\|\|[A-Z_]+\|\|)\s*:?\s*(?P<message>.*)")
_ERROR_CODE = re.compile(r"\[(?:NCC_[A-Z0-9]+|[EF]\d+)\]")
# Lines that follow ERROR but explain nothing: traceback frames, the version banner, rules.
_NOISE = re.compile(r"^(File \"|Traceback|Version information|NeuronX Compiler version|Python version|"
                    r"HWM version|NEFF version|TVM |NumPy version|Running on|Command line|\*+$|$)")


class NeuronCompileError(RuntimeError):
    """neuronx-cc could not compile one of the trial's graphs; the message is its own."""


def is_compile_failure(error: BaseException) -> bool:
    text = str(error).lower()
    return any(marker.lower() in text for marker in FAILURE_MARKERS)


def compiler_message(log_text: str) -> list[str]:
    """The lines of a neuronx-cc log (or captured stderr) that say why it failed:
    error-code lines first, then other ERROR lines, de-duplicated, at most MAX_LINES."""
    coded, other = [], []
    for line in log_text.splitlines():
        match = _ERROR_LINE.search(line)
        if not match:
            if _ERROR_CODE.search(line):
                coded.append(line.strip())
            continue
        message = match.group("message").strip()
        if _NOISE.match(message):
            continue
        (coded if _ERROR_CODE.search(message) else other).append(message)
    seen, kept = set(), []
    for message in coded + other:
        if message not in seen:
            seen.add(message)
            kept.append(message)
    return kept[:MAX_LINES]


def compile_log_roots(cache_url: Optional[str]) -> list[str]:
    """Where neuronx-cc leaves its logs: its work directory, and a local compile cache
    (failed graphs are kept there with their log)."""
    roots = [os.path.join("/tmp", getpass.getuser(), "neuroncc_compile_workdir")]
    if cache_url and not cache_url.startswith("s3://"):
        roots.append(cache_url)
    roots.append("/var/tmp/neuron-compile-cache")
    return roots


def recent_logs(roots: Iterable[str], since: float) -> list[str]:
    """Compiler logs written at or after ``since`` (a time.time()), newest first."""
    found = []
    for root in roots:
        for path in glob.glob(os.path.join(root, "**", LOG_NAME), recursive=True):
            try:
                if os.path.getmtime(path) >= since:
                    found.append(path)
            except OSError:
                continue  # removed while we looked
    return sorted(found, key=os.path.getmtime, reverse=True)


def explain(error: BaseException, flags: str, roots: Iterable[str], since: float) -> Optional[NeuronCompileError]:
    """A NeuronCompileError carrying the compiler's words for a compile failure; None
    for any other error. One line, because that is what a failed trial's tag shows."""
    if not is_compile_failure(error):
        return None
    lines: list[str] = []
    for path in recent_logs(roots, since):
        with open(path, errors="replace") as log:
            lines = compiler_message(log.read())
        if lines:
            break
    if not lines:
        lines = compiler_message(str(error)) or [str(error).strip().splitlines()[-1]]
    return NeuronCompileError(f"neuronx-cc failed (NEURON_CC_FLAGS={flags!r}): " + " | ".join(lines))
