"""The built-in studies by name, and the command-line parser of any study script.

A study is a module of ``accelsweep.sweeps`` that runs as a script (``python
sweeps/neuron_vit.py``, or ``accelsweep run neuron_vit``). What it is about is its
docstring's first paragraph; where it runs is said here, next to its name, because the
platforms a study accepts are decided in its code at run time (``platform_from_args``).

``study_parser(name)`` returns the parser a study builds, without running the study: the
module is run as ``__main__`` up to its ``parse_args`` call, which hands the parser back
instead of parsing. The docs' flag reference and ``accelsweep run NAME --help`` both come
from it, so neither can drift from the code.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import os
import runpy
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Iterator, Sequence

from accelsweep.trainables.errors import ConfigError


@dataclass(frozen=True)
class Study:
    name: str
    runs_on: str  # the platforms it accepts, the local default first
    kind: str  # "training" or "kernel": what its trials run

    @property
    def module(self) -> str:
        return f"accelsweep.sweeps.{self.name}"

    @property
    def summary(self) -> str:
        """The first paragraph of the study's docstring, on one line (read from the
        source: listing the studies imports none of them)."""
        spec = importlib.util.find_spec(self.module)
        with open(spec.origin) as source:
            docstring = ast.get_docstring(ast.parse(source.read())) or ""
        return " ".join(docstring.split("\n\n")[0].split())


STUDIES = {study.name: study for study in (
    Study("neuron_vit", "cpu, cuda, xla, neuron, tpu", "training"),
    Study("cpu_resnet", "cpu", "training"),
    Study("vit_attention", "cpu, cuda", "training"),
    Study("varlen_gpt", "cpu, cuda", "training"),
    Study("metric_collection", "cpu, cuda, xla", "training"),
    Study("attention_kernels", "cpu, cuda", "kernel"),
    Study("giou_kernels", "cpu, cuda, xla, neuron", "kernel"),
    Study("nms_kernels", "cpu, cuda, tpu", "kernel"),
    Study("pallas_matmul", "cpu (Pallas interpreted), tpu", "kernel"),
)}


def study_target(target: str) -> tuple[str, str]:
    """("module", name) for a built-in study, ("path", file) for a user's script; else
    a ConfigError naming the studies."""
    if target in STUDIES:
        return "module", STUDIES[target].module
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise ConfigError("study", "a study name or an existing .py script", target, "No such file.")
        return "path", os.path.abspath(target)
    raise ConfigError("study", f"one of {', '.join(STUDIES)}, or the path of a sweep script (.py)", target)


def run_study(target: str, argv: Sequence[str]) -> None:
    """Run a study (by name) or a user's sweep script (by path) as its own ``__main__``,
    with ``argv`` as its command line: exactly what ``python sweeps/<name>.py ARGV`` does."""
    kind, where = study_target(target)
    with _argv([where if kind == "path" else target, *argv]):
        if kind == "module":
            runpy.run_module(where, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(where))  # as python does for a script: its folder imports
            runpy.run_path(where, run_name="__main__")


class _ParserReady(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


_capture_lock = threading.Lock()


def study_parser(target: str) -> argparse.ArgumentParser:
    """The parser of a study (by name) or a sweep script (by path), as its main builds it."""
    kind, where = study_target(target)
    original = argparse.ArgumentParser.parse_args

    def hand_back(parser, args=None, namespace=None):
        raise _ParserReady(parser)

    with _capture_lock, _argv([target]):
        argparse.ArgumentParser.parse_args = hand_back
        try:
            if kind == "module":  # as its own __main__, as run_study runs it
                with warnings.catch_warnings():
                    # A process that imported the study already (a test, a notebook): runpy warns,
                    # yet runs its code afresh as __main__, which is all that is read here.
                    warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
                    runpy.run_module(where, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(where, run_name="__main__")
        except _ParserReady as ready:
            ready.parser.prog = f"accelsweep run {target}"
            return ready.parser
        finally:
            argparse.ArgumentParser.parse_args = original
    raise ConfigError("study", "a script that parses its flags with argparse", target,
                      "It ran to its end without parsing any.")


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = list(argv)
    try:
        yield
    finally:
        sys.argv = saved


def flags_of(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's options (not --help, not positionals), in the order it lists them."""
    return [action for action in parser._actions
            if action.option_strings and not isinstance(action, argparse._HelpAction)]
