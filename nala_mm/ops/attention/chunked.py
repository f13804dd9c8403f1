"""Kernelised attention, fast mode: one autograd node that walks the tokens in chunks.

The forward keeps only q, k, v, the small state S (``e*d x d``), the key mean and the per-token
normaliser; the backward recomputes the element-wise features from q and k and applies the maps'
analytic derivatives. Both passes walk the tokens in chunks (S and kbar are sums over tokens), so
the transient memory is ``O(chunk * d)`` instead of ``O(N * d)``. RoPE is one complex multiply
over the whole feature. The formula, notation and reference are in :mod:`.naive`.

Backward (``G = rope(F)``):
    dnum = dO z,        dz = sum(dO * G_q S) -> dden = -dz z^2
    dS = G_q^T dnum,    dG_q = dnum S^T,     dF_q = rope^-1(dG_q) + dden kbar
    dkbar = dden^T F_q, dv = G_k dS / N,     dG_k = v dS^T / N,  dF_k = rope^-1(dG_k) + dkbar / N
then ``phi.backward`` of each map.
"""
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .feature_maps import FeatureMap
from .rope import Rope, apply_rope, rope_phasor

# Tokens per chunk: large enough that per-chunk overhead vanishes, small enough that the
# element-wise temporaries of a chunk stay in cache-sized blocks (2048 x 128 floats = 1 MiB) and
# add little to the backward's peak memory (benchmarks/speed/attention.py).
DEFAULT_CHUNK = 2048


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


def _token_major(q: Tensor, dims: int) -> Tensor:
    """An uninitialised ``(..., heads, N, dims)`` output stored as ``(..., N, heads, dims)``: the
    caller's merge of the heads into channels-last tokens is then a view, not a copy."""
    *batch, n_tokens, _ = q.shape
    if not batch:
        return q.new_empty(n_tokens, dims)
    return q.new_empty(*batch[:-1], n_tokens, batch[-1], dims).transpose(-3, -2)


class ChunkedKernelizedAttention(torch.autograd.Function):
    """The fast mode's autograd node (its name is what FLOP counters see in a traced graph)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, phasor: Optional[Tensor],
                query_map: FeatureMap, key_map: FeatureMap, eps: float, chunk: int):
        *batch, n_tokens, dims = q.shape
        width = key_map.expansion * dims
        key_sum = q.new_zeros(*batch, 1, width)
        state = q.new_zeros(*batch, width, v.shape[-1])
        for start, length in _chunks(n_tokens, chunk):
            phi_k = key_map.forward_(_rows(k, start, length))
            key_sum += phi_k.sum(dim=-2, keepdim=True)
            rotated = _rotate(phi_k, _rows(phasor, start, length))
            state += rotated.transpose(-1, -2) @ _rows(v, start, length)
        key_mean = key_sum.div_(n_tokens)
        state = state.div_(n_tokens)

        out = _token_major(q, v.shape[-1])
        # the normaliser is kept for the backward only; an inference call skips the copy
        training = any(ctx.needs_input_grad[:3])
        normaliser = q.new_empty(*batch, n_tokens, 1) if training else None
        for start, length in _chunks(n_tokens, chunk):
            phi_q = query_map.forward_(_rows(q, start, length))
            z = torch.reciprocal((phi_q @ key_mean.transpose(-1, -2)).add_(eps))
            if training:
                _rows(normaliser, start, length).copy_(z)
            rotated = _rotate(phi_q, _rows(phasor, start, length))
            torch.mul(rotated @ state, z, out=_rows(out, start, length))
        if training:
            ctx.save_for_backward(q, k, v, phasor, key_mean, state, normaliser)
        ctx.maps, ctx.chunk = (query_map, key_map), chunk
        return out

    @staticmethod
    # The hand-written backward is not differentiable itself: refuse double backward rather
    # than return silently wrong second-order gradients.
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        q, k, v, phasor, key_mean, state, normaliser = ctx.saved_tensors
        (query_map, key_map), chunk = ctx.maps, ctx.chunk
        n_tokens = k.shape[-2]

        d_q = torch.empty_like(q)
        d_state = torch.zeros_like(state)
        d_key_mean = torch.zeros_like(key_mean)
        for start, length in _chunks(n_tokens, chunk):
            rope = _rows(phasor, start, length)
            q_rows = _rows(q, start, length)
            phi_q = query_map.forward_(q_rows)
            rot_q = _rotate(phi_q, rope)
            z = _rows(normaliser, start, length)
            d_num = _rows(d_out, start, length) * z
            # dden = -(sum dO * num) z^2 = -(sum d_num * G_q S) z
            d_den = ((d_num * (rot_q @ state)).sum(-1, keepdim=True)).mul_(z).neg_()
            d_state += rot_q.transpose(-1, -2) @ d_num
            del rot_q
            d_phi_q = _rotate(d_num @ state.transpose(-1, -2), rope, inverse=True)
            d_phi_q.addcmul_(d_den, key_mean)
            d_key_mean += d_den.transpose(-1, -2) @ phi_q
            del phi_q
            _rows(d_q, start, length).copy_(query_map.backward(q_rows, d_phi_q))

        d_k, d_v = torch.empty_like(k), torch.empty_like(v)
        d_state.div_(n_tokens)
        d_key_mean.div_(n_tokens)
        for start, length in _chunks(n_tokens, chunk):
            rope = _rows(phasor, start, length)
            k_rows = _rows(k, start, length)
            rot_k = _rotate(key_map.forward_(k_rows), rope)
            _rows(d_v, start, length).copy_(rot_k @ d_state)
            del rot_k
            d_phi_k = _rotate(_rows(v, start, length) @ d_state.transpose(-1, -2), rope,
                              inverse=True).add_(d_key_mean)
            _rows(d_k, start, length).copy_(key_map.backward(k_rows, d_phi_k))
        return d_q, d_k, d_v, None, None, None, None, None


def kernelized_attention_chunked(q: Tensor, k: Tensor, v: Tensor, query_map: FeatureMap,
                                 key_map: FeatureMap, eps: float = 1e-6, rope: Rope = None,
                                 chunk: int = DEFAULT_CHUNK) -> Tensor:
    """As :func:`.naive.kernelized_attention_naive`; ``chunk`` bounds the tokens processed at once
    (memory of the temporaries), not the result."""
    if chunk < 1:
        raise ValueError(f'chunk must be >= 1 token, got chunk={chunk}')
    phasor = None if rope is None else rope_phasor(*rope)
    return ChunkedKernelizedAttention.apply(q, k, v, phasor, query_map, key_map, eps, chunk)
