"""The package tests' setup for the project's tests: tests/conftest.py's module-level setup runs
on this import, and its autouse fixtures (a seeded start, recompile limits that raise) apply
here as they do in tests/."""
from tests.conftest import recompile_limit_raises, seeded  # noqa: F401
