"""Kernelised attention, fast mode: the four kernels behind the custom ops of :mod:`.custom_ops`.

The attention splits at its state. Per head, with ``G = rope(F)`` (notation of :mod:`.naive`):

* **state** (keys and values): ``S_sum = sum_j G_k[j]^T v[j]`` (``e*d x d``) and the key sum
  ``sum_j F_k[j]`` (``1 x e*d``). The caller divides both by the token count N (the sums of
  several ranks add up first when the tokens are split across ranks);
* **readout** (queries): ``z = 1 / (F_q kbar^T + eps)``, ``o = (G_q S) z`` with the state's and
  the key sum's means ``S``, ``kbar``. The normaliser ``z`` is an output too: the backward
  needs it, and a custom op's autograd sees only its inputs and outputs.

Every kernel walks the tokens in chunks (the sums are over tokens), so the transient memory is
``O(chunk * d)`` instead of ``O(N * d)``; the forward keeps nothing but its outputs, and the
backward recomputes the element-wise features from q and k with the maps' analytic derivatives.
RoPE is one complex multiply over the whole feature, its phasor formed here from the real
``(cos, sin)`` tables (no complex tensor leaves a kernel).

Backward of the readout (``d_num = dO z``):
    dz = sum(dO * G_q S) + d_normaliser,  dden = -dz z^2
    dS = G_q^T d_num,   dF_q = rope^-1(d_num S^T) + dden kbar,   dkbar = dden^T F_q
Backward of the state (gradients w.r.t. the sums):
    dv = G_k dS_sum,    dF_k = rope^-1(v dS_sum^T) + dkey_sum
then ``phi.backward`` of each map.
"""
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

from .feature_maps import FeatureMap
from .rope import apply_rope, rope_phasor

# Tokens per chunk: large enough that per-chunk overhead vanishes, small enough that the
# element-wise temporaries of a chunk stay in cache-sized blocks (2048 x 128 floats = 1 MiB) and
# add little to the backward's peak memory (benchmarks/speed/attention.py).
DEFAULT_CHUNK = 2048


def phasor_of(cos: Optional[Tensor], sin: Optional[Tensor]) -> Optional[Tensor]:
    """The RoPE tables as unit complex numbers ``(N, 1, d/2)``; ``None`` without RoPE."""
    if (cos is None) != (sin is None):
        raise ValueError('RoPE needs both tables, cos and sin, or neither')
    return None if cos is None else rope_phasor(cos, sin)


def _rotate(x: Tensor, phasor: Optional[Tensor], inverse: bool = False) -> Tensor:
    return x if phasor is None else apply_rope(x, phasor, inverse=inverse)


def _chunks(n_tokens: int, chunk: int) -> Iterator[Tuple[int, int]]:
    for start in range(0, n_tokens, chunk):
        yield start, min(chunk, n_tokens - start)


def _rows(t: Optional[Tensor], start: int, length: int) -> Optional[Tensor]:
    """Token rows [start, start + length) of a (..., N, x) tensor or an (N, 1, x) phasor."""
    if t is None:
        return None
    return t.narrow(-3 if t.is_complex() else -2, start, length)


def token_major(q: Tensor, dims: int) -> Tensor:
    """An uninitialised ``(..., heads, N, dims)`` output stored as ``(..., N, heads, dims)``: the
    caller's merge of the heads into channels-last tokens is then a view, not a copy. (The
    readout's fake kernel allocates the same layout.)"""
    *batch, n_tokens, _ = q.shape
    if not batch:
        return q.new_empty(n_tokens, dims)
    return q.new_empty(*batch[:-1], n_tokens, batch[-1], dims).transpose(-3, -2)


def state_forward(k: Tensor, v: Tensor, phasor: Optional[Tensor], key_map: FeatureMap,
                  chunk: int) -> Tuple[Tensor, Tensor]:
    """``(sum_j G_k^T v, sum_j F_k)``: ``(..., e*d, d_v)`` and ``(..., 1, e*d)``."""
    *batch, n_tokens, dims = k.shape
    width = key_map.expansion * dims
    key_sum = k.new_zeros(*batch, 1, width)
    state = k.new_zeros(*batch, width, v.shape[-1])
    for start, length in _chunks(n_tokens, chunk):
        phi_k = key_map.forward_(_rows(k, start, length))
        key_sum += phi_k.sum(dim=-2, keepdim=True)
        rotated = _rotate(phi_k, _rows(phasor, start, length))
        state += rotated.transpose(-1, -2) @ _rows(v, start, length)
    return state, key_sum


def state_backward(d_state: Tensor, d_key_sum: Tensor, k: Tensor, v: Tensor,
                   phasor: Optional[Tensor], key_map: FeatureMap,
                   chunk: int) -> Tuple[Tensor, Tensor]:
    """Gradients of k and v from those of the two sums."""
    d_k, d_v = torch.empty_like(k), torch.empty_like(v)
    for start, length in _chunks(k.shape[-2], chunk):
        rope = _rows(phasor, start, length)
        k_rows = _rows(k, start, length)
        rot_k = _rotate(key_map.forward_(k_rows), rope)
        _rows(d_v, start, length).copy_(rot_k @ d_state)
        del rot_k
        d_phi_k = _rotate(_rows(v, start, length) @ d_state.transpose(-1, -2), rope,
                          inverse=True).add_(d_key_sum)
        _rows(d_k, start, length).copy_(key_map.backward(k_rows, d_phi_k))
    return d_k, d_v


def readout_forward(q: Tensor, state: Tensor, key_mean: Tensor, phasor: Optional[Tensor],
                    query_map: FeatureMap, eps: float, chunk: int) -> Tuple[Tensor, Tensor]:
    """``(o, z)``: the output, token-major (:func:`token_major`), and the normaliser
    ``(..., N, 1)``."""
    *batch, n_tokens, _ = q.shape
    out = token_major(q, state.shape[-1])
    normaliser = q.new_empty(*batch, n_tokens, 1)
    for start, length in _chunks(n_tokens, chunk):
        phi_q = query_map.forward_(_rows(q, start, length))
        z = torch.reciprocal((phi_q @ key_mean.transpose(-1, -2)).add_(eps),
                             out=_rows(normaliser, start, length))
        rotated = _rotate(phi_q, _rows(phasor, start, length))
        torch.mul(rotated @ state, z, out=_rows(out, start, length))
    return out, normaliser


def readout_backward(d_out: Tensor, d_normaliser: Optional[Tensor], q: Tensor, state: Tensor,
                     key_mean: Tensor, normaliser: Tensor, phasor: Optional[Tensor],
                     query_map: FeatureMap, chunk: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of q, the state (mean) and the key mean."""
    d_q = torch.empty_like(q)
    d_state = torch.zeros_like(state)
    d_key_mean = torch.zeros_like(key_mean)
    for start, length in _chunks(q.shape[-2], chunk):
        rope = _rows(phasor, start, length)
        q_rows = _rows(q, start, length)
        phi_q = query_map.forward_(q_rows)
        rot_q = _rotate(phi_q, rope)
        z = _rows(normaliser, start, length)
        d_num = _rows(d_out, start, length) * z
        # dden = -(sum dO * num + dz_direct) z^2, with num = G_q S z
        d_den = (d_num * (rot_q @ state)).sum(-1, keepdim=True)
        if d_normaliser is not None:
            d_den.addcmul_(_rows(d_normaliser, start, length), z)
        d_den.mul_(z).neg_()
        d_state += rot_q.transpose(-1, -2) @ d_num
        del rot_q
        d_phi_q = _rotate(d_num @ state.transpose(-1, -2), rope, inverse=True)
        d_phi_q.addcmul_(d_den, key_mean)
        d_key_mean += d_den.transpose(-1, -2) @ phi_q
        del phi_q
        _rows(d_q, start, length).copy_(query_map.backward(q_rows, d_phi_q))
    return d_q, d_state, d_key_mean
