"""Importing this module installs :mod:`nala_mm.compat` (``nala_mm.compat.install()``) for the
rest of the process: the opt-in for a config, whose ``custom_imports`` can only import::

    custom_imports = dict(imports=['nala_mm', 'nala_mm.compat.enable'], allow_failed_imports=False)
"""
from . import install

install()
