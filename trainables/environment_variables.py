"""Environment variables set for a while and put back as they were: a sweep's settings,
MLflow's credentials, Tune's signal-handler switch. One way to do it, so that "was it
unset before?" is answered the same everywhere (unset stays unset, not empty)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator, Mapping, Optional

Snapshot = Mapping[str, Optional[str]]


def environment_snapshot(names: Iterable[str]) -> dict[str, Optional[str]]:
    """Each variable's value now; None for one that is unset."""
    return {name: os.environ.get(name) for name in names}


def restore_environment(snapshot: Snapshot) -> None:
    for name, value in snapshot.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def environment_restored(names: Iterable[str]) -> Iterator[None]:
    """The variables ``names`` as they were before, whatever is set or unset meanwhile."""
    snapshot = environment_snapshot(names)
    try:
        yield
    finally:
        restore_environment(snapshot)


@contextlib.contextmanager
def whole_environment_restored() -> Iterator[None]:
    """The whole environment as it was before: a variable set meanwhile (by a library
    imported inside, by Ray's start) is unset again, one changed gets its value back."""
    snapshot = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(snapshot):
            del os.environ[name]
        for name, value in snapshot.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
