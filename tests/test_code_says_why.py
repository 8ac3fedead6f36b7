"""Code says why, not when: no comment or docstring of the package (accelsweep/, sweeps/,
trainables/, kernels/) names a run's date, a UTC time or an issue number (those are stale
the day the next run lands: the record lives in benchmarks/results/, the history in git),
and a module's docstring says what it is for in at most 15 lines."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOTS = ("accelsweep", "sweeps", "trainables", "kernels")
MAX_MODULE_DOCSTRING_LINES = 15
WHEN = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b[0-2]\d:[0-5]\d(?: ?UTC\b|-[0-2]\d:[0-5]\d\b)|\bissues? #?\d+\b",
                  re.I)
# Text that is data, not a record of a run: examples of a log format the code parses.
NOT_A_RUN = {
    "trainables/platforms/neuron_errors.py": ("2023-06-15T12:11:12Z", "2022-11-22 19:07:46"),
}


def _sources() -> list[Path]:
    return sorted(p for root in ROOTS for p in (Path(REPO) / root).rglob("*.py") if "__pycache__" not in p.parts)


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and token.string.lstrip("rbuRBU")[:3] in ('"""', "'''"):
            found.append((token.start[0], token.string))
    return found


def when_it_was(path: Path) -> list[str]:
    relative = str(path.relative_to(REPO))
    allowed = NOT_A_RUN.get(relative, ())
    hits = []
    for line, text in comments_and_docstrings(path.read_text()):
        for match in WHEN.finditer(text):
            context = text[max(0, match.start() - 12):match.end() + 12]
            if not any(example in context for example in allowed):
                hits.append(f"{relative}:{line + text.count(chr(10), 0, match.start())}: {match.group(0)!r}")
    return hits


def test_no_comment_says_when():
    hits = [hit for path in _sources() for hit in when_it_was(path)]
    assert not hits, "dates, UTC times or issue numbers in comments or docstrings:\n" + "\n".join(hits)


def test_module_docstrings_are_short():
    long = []
    for path in _sources():
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if docstring and docstring.count("\n") + 1 > MAX_MODULE_DOCSTRING_LINES:
            long.append(f"{path.relative_to(REPO)}: {docstring.count(chr(10)) + 1} lines")
    assert not long, f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines:\n" + "\n".join(long)


@pytest.mark.parametrize("text", ["# measured 2026-11-27 on the VM", "# issue 37's record", "# the 12:08-12:46 run",
                                  '"""Seen at 15:01 UTC."""'])
def test_the_check_finds_a_date_in_a_comment(tmp_path, text, monkeypatch):
    module = tmp_path / "sweeps" / "m.py"
    module.parent.mkdir()
    module.write_text(f"x = 1\n{text}\n")
    monkeypatch.setattr("tests.test_code_says_why.REPO", str(tmp_path))
    assert when_it_was(module)


def test_the_check_leaves_code_and_data_alone(tmp_path, monkeypatch):
    module = tmp_path / "sweeps" / "m.py"
    module.parent.mkdir()
    module.write_text('PRICE_TABLE_DATE = "2026-11-01"  # the day the prices were read\n'
                      'STAMP = time.strftime("%Y-%m-%d %H:%M UTC")\n')
    monkeypatch.setattr("tests.test_code_says_why.REPO", str(tmp_path))
    assert not when_it_was(module)
