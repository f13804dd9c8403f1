"""Kernelised attention (NaLa and plain linear attention): one op, two modes.

``mode='reference'`` is the formula in plain ops (:mod:`.naive`); ``'fast'`` is the chunked node
with a hand-written backward (:mod:`.chunked`). Feature maps are small named objects
(:mod:`.feature_maps`), NaLa's settings a frozen config (:mod:`.config`), positions a 2D RoPE
(:mod:`.rope`). The method: docs/method.md.
"""
from torch import Tensor

from ..mode import resolve_mode
from .chunked import DEFAULT_CHUNK, ChunkedKernelizedAttention, kernelized_attention_chunked
from .config import KERNELS, NaLaConfig
from .feature_maps import (PLAIN_FEATURE_MAPS, SIGN_SPLITS, FeatureMap, build_plain_feature_map,
                           build_sign_split)
from .naive import kernelized_attention_naive, kernelized_attention_weights
from .rope import (Rope, apply_rope, apply_rope_reference, rope_angle_buffer, rope_frequencies,
                   rope_phasor, rope_table, rope_table_for)


def kernelized_attention(q: Tensor, k: Tensor, v: Tensor, query_map: FeatureMap,
                         key_map: FeatureMap, eps: float = 1e-6, rope: Rope = None,
                         mode: str = 'fast', chunk: int = DEFAULT_CHUNK) -> Tensor:
    """Kernelised attention on ``(B, heads, N, d)`` float32 tensors; ``rope`` = ``(cos, sin)``.

    ``chunk`` bounds the tokens the fast mode processes at once (memory), not the result.
    """
    if resolve_mode(mode) == 'reference':
        return kernelized_attention_naive(q, k, v, query_map, key_map, eps, rope)
    return kernelized_attention_chunked(q, k, v, query_map, key_map, eps, rope, chunk)


def nala_attention(q: Tensor, k: Tensor, v: Tensor, cfg: NaLaConfig, rope: Rope = None,
                   mode: str = 'fast', chunk: int = DEFAULT_CHUNK) -> Tensor:
    """NaLa attention on ``(B, heads, N, d)`` float32 tensors; ``rope`` = ``(cos, sin)``."""
    return kernelized_attention(q, k, v, *cfg.feature_maps(), cfg.eps, rope, mode, chunk)


def nala_attention_reference(q: Tensor, k: Tensor, v: Tensor, cfg: NaLaConfig,
                             rope: Rope = None) -> Tensor:
    """``nala_attention(..., mode='reference')``."""
    return nala_attention(q, k, v, cfg, rope, mode='reference')


def nala_attention_matrix(q: Tensor, k: Tensor, cfg: NaLaConfig, rope: Rope = None) -> Tensor:
    """The implied N x N attention, for tests and inspection only (quadratic memory)."""
    return kernelized_attention_weights(q, k, *cfg.feature_maps(), cfg.eps, rope, rope)


__all__ = [
    'DEFAULT_CHUNK', 'ChunkedKernelizedAttention', 'KERNELS', 'NaLaConfig', 'PLAIN_FEATURE_MAPS',
    'SIGN_SPLITS', 'FeatureMap', 'Rope', 'apply_rope', 'apply_rope_reference',
    'build_plain_feature_map', 'build_sign_split', 'kernelized_attention',
    'kernelized_attention_chunked', 'kernelized_attention_naive', 'kernelized_attention_weights',
    'nala_attention', 'nala_attention_matrix', 'nala_attention_reference', 'rope_angle_buffer',
    'rope_frequencies', 'rope_phasor', 'rope_table', 'rope_table_for',
]
