"""The package's math: kernelised attention (:mod:`.attention`), the block's CPU nodes
(:mod:`.fused`), and the one ``mode`` switch they share (:mod:`.mode`).

``__all__`` is the public surface: what the models, the analysis, the tests, the docs and a new
mixer (a :class:`FeatureMap` pair for :func:`kernelized_attention`) use. The modules below hold
the rest (chunk sizes, the sign splits, each mode's own entry).
"""
from . import attention, fused
from .attention import *  # noqa: F401,F403  (its __all__, below)
from .fused import *  # noqa: F401,F403
from .mode import MODES, is_exporting, resolve_mode

__all__ = [*attention.__all__, *fused.__all__, 'MODES', 'is_exporting', 'resolve_mode']
