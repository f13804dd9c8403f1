"""The package tests' setup (tests/conftest.py: its module-level setup, a seeded start, recompile
limits that raise) for the tests of the benchmarks' helpers."""
from tests.conftest import recompile_limit_raises, seeded  # noqa: F401
