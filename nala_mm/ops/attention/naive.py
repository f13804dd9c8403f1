"""Kernelised attention as its formula in plain tensor ops: the reference mode.

Per head, with feature maps ``F_q = phi_q(q)``, ``F_k = phi_k(k)`` (``(N, e*d)``, see
:mod:`.feature_maps`), rotated features ``G = rope(F)`` and the key mean ``kbar = mean_j F_k``
(docs/user_guides/method.md, "Normaliser and state"):

    z = 1 / (F_q kbar^T + eps),   S = G_k^T v / N,   o = (G_q S) z

NaLa and plain linear attention differ only in their feature maps. Autograd differentiates this
form; it is the ground truth of the fast mode (:mod:`.chunked`) and what runs while exporting.
"""
from typing import Optional, Tuple

from torch import Tensor

from .feature_maps import FeatureMap
from .global_keys import GlobalKeys
from .rope import Rope, apply_rope_reference


def _features(q: Tensor, k: Tensor, query_map: FeatureMap, key_map: FeatureMap,
              eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """phi(q), phi(k) and the normaliser z (from the unrotated features)."""
    phi_q, phi_k = query_map.forward(q), key_map.forward(k)
    normaliser = 1.0 / (phi_q @ phi_k.mean(dim=-2, keepdim=True).transpose(-1, -2) + eps)
    return phi_q, phi_k, normaliser


def _rotate(x: Tensor, rope: Rope) -> Tensor:
    return x if rope is None else apply_rope_reference(x, *rope)


def kernelized_attention_naive(q: Tensor, k: Tensor, v: Tensor, query_map: FeatureMap,
                               key_map: FeatureMap, eps: float = 1e-6,
                               rope: Rope = None,
                               global_keys: Optional[GlobalKeys] = None) -> Tensor:
    """``(B, heads, N, d)`` q, k, v -> mixed values; ``rope`` = ``(cos, sin)`` tables.
    ``global_keys``: the tokens are this rank's part of a larger set (:mod:`.global_keys`)."""
    if global_keys is not None:
        return _over_ranks(q, k, v, query_map, key_map, eps, rope, global_keys)
    phi_q, phi_k, normaliser = _features(q, k, query_map, key_map, eps)
    phi_q, phi_k = _rotate(phi_q, rope), _rotate(phi_k, rope)
    state = phi_k.transpose(-1, -2) @ v / k.shape[-2]  # (e*d, d): linear in N
    return (phi_q @ state) * normaliser


def _over_ranks(q: Tensor, k: Tensor, v: Tensor, query_map: FeatureMap, key_map: FeatureMap,
                eps: float, rope: Rope, global_keys: GlobalKeys) -> Tensor:
    """The formula with the key mean and the state as global means of every rank's sums."""
    k, v, key_rope = global_keys.own_keys(k, v, rope)
    phi_k = key_map.forward(k)
    state, key_mean = global_keys.means(_rotate(phi_k, key_rope).transpose(-1, -2) @ v,
                                        phi_k.sum(dim=-2, keepdim=True))
    phi_q = query_map.forward(q)
    normaliser = 1.0 / (phi_q @ key_mean.transpose(-1, -2) + eps)
    return (_rotate(phi_q, rope) @ state) * normaliser


def kernelized_attention_weights(q: Tensor, k: Tensor, query_map: FeatureMap,
                                 key_map: FeatureMap, eps: float = 1e-6,
                                 query_rope: Rope = None, key_rope: Rope = None) -> Tensor:
    """The implied weights ``(..., N_q, N_k)`` (output = weights @ v), for tests and inspection.

    ``q`` may hold a few query rows (their RoPE entries in ``query_rope``) against all keys:
    rows of chosen queries stay cheap at full resolution, where the whole matrix is quadratic.
    Without RoPE each row is a distribution (non-negative, sums to 1).
    """
    phi_q, phi_k, normaliser = _features(q, k, query_map, key_map, eps)
    phi_q, phi_k = _rotate(phi_q, query_rope), _rotate(phi_k, key_rope)
    return (phi_q @ phi_k.transpose(-1, -2)) * normaliser / k.shape[-2]
