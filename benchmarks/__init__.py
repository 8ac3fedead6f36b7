"""Benchmarks of the tool itself (not installed with it): each module is one command,
importable for its tests."""
