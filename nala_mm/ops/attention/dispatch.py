"""The kernelised-attention op: one signature, ``mode='fast' | 'reference'`` resolved here.

``'reference'`` is the formula in plain ops (:mod:`.naive`); ``'fast'`` the two custom ops with
hand-written backward ops (:mod:`.custom_ops`), eager and compiled alike; while exporting,
:func:`nala_mm.ops.resolve_mode` forces the reference.
"""
from typing import Optional

from torch import Tensor

from ..mode import resolve_mode
from .chunked import DEFAULT_CHUNK
from .config import NaLaConfig
from .custom_ops import kernelized_attention_chunked
from .feature_maps import FeatureMap
from .global_keys import GlobalKeys
from .naive import kernelized_attention_naive
from .rope import Rope


def kernelized_attention(q: Tensor, k: Tensor, v: Tensor, query_map: FeatureMap,
                         key_map: FeatureMap, eps: float = 1e-6, rope: Rope = None,
                         mode: str = 'fast', chunk: int = DEFAULT_CHUNK,
                         global_keys: Optional[GlobalKeys] = None) -> Tensor:
    """Kernelised attention on ``(B, heads, N, d)`` float32 tensors; ``rope`` = ``(cos, sin)``.

    ``chunk`` bounds the tokens the fast mode processes at once (memory), not the result.
    ``global_keys``: the tokens are this rank's part of a set split across ranks
    (:mod:`.global_keys`); the state's sums are all-reduced between state and readout.
    """
    # custom ops: dynamo and inductor take them as they are
    if resolve_mode(mode, traceable=True) == 'reference':
        return kernelized_attention_naive(q, k, v, query_map, key_map, eps, rope, global_keys)
    return kernelized_attention_chunked(q, k, v, query_map, key_map, eps, rope, chunk,
                                        global_keys)


def nala_attention(q: Tensor, k: Tensor, v: Tensor, cfg: NaLaConfig, rope: Rope = None,
                   mode: str = 'fast', chunk: int = DEFAULT_CHUNK) -> Tensor:
    """NaLa attention on ``(B, heads, N, d)`` float32 tensors; ``rope`` = ``(cos, sin)``."""
    return kernelized_attention(q, k, v, *cfg.feature_maps(), cfg.eps, rope, mode, chunk)
