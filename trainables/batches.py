"""A batch's inputs and targets as the loop sees them: a tensor, or a tuple, list or dict
of tensors (a workload's packed sequences with their document ids). ``map_tensors``
applies a function to every tensor in one, keeping its structure."""

from __future__ import annotations

from typing import Any, Callable


def map_tensors(function: Callable[[Any], Any], value: Any) -> Any:
    """``value`` with ``function`` applied to each tensor in it (anything with ``.to``)."""
    if isinstance(value, dict):
        return {key: map_tensors(function, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(function, item) for item in value)
    return function(value) if hasattr(value, "to") else value
