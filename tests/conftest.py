"""Shared fixtures and helpers of the test suite.

The suite runs with :mod:`nala_mm.compat` installed, as the project's tools do (tests of what a
bare ``import nala_mm`` changes run in a fresh interpreter: tests/test_compat.py).
"""
import nala_mm.compat  # noqa: F401
