"""The fast kernelised attention as torch custom ops: two ops split at the state, each with a
backward that is itself a custom op.

    nala_mm::kernelized_state(k, v, cos, sin, key map)            -> (state sum, key sum)
    nala_mm::kernelized_readout(q, state, key mean, cos, sin, query map, eps) -> (out, z)

:func:`kernelized_attention_chunked` divides the two sums by the token count between them; a
token-parallel caller all-reduces the sums there first. Each op is one node to ``torch.compile``
(dynamo, AOTAutograd and inductor see the op and its fake kernel, never its Python chunk loop):
the graph holds the hand-written kernels of :mod:`.chunked` in eager and compiled runs alike,
and the backward ops keep the loop out of AOTAutograd's trace too (traced, it would specialise
on the token count and recompile at every size). The fake kernels return the real outputs'
shapes and strides (the readout's output is token-major). A feature map travels as its
registered name and numbers (:func:`.feature_maps.feature_map_spec`); RoPE as the real
``(cos, sin)`` tables, turned into the complex phasor inside the kernels. The ops compute in
their inputs' dtype; the mixers call them on float32 (NaLa's powers overflow 16-bit formats).
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .chunked import (
    DEFAULT_CHUNK,
    phasor_of,
    readout_backward,
    readout_forward,
    state_backward,
    state_forward,
    token_major,
)
from .feature_maps import FeatureMap, feature_map_from_spec, feature_map_spec
from .global_keys import GlobalKeys
from .rope import Rope

# the ops' names, as traced graphs (and the FLOP counter's handles) know them
STATE_OP = 'nala_mm::kernelized_state'
READOUT_OP = 'nala_mm::kernelized_readout'

# ------------------------------------------------------------------------------ state
@torch.library.custom_op(STATE_OP, mutates_args=())
def kernelized_state(k: Tensor, v: Tensor, cos: Optional[Tensor], sin: Optional[Tensor],
                     key_map: str, key_numbers: List[float],
                     chunk: int) -> Tuple[Tensor, Tensor]:
    """``(sum_j rope(phi(k_j))^T v_j, sum_j phi(k_j))`` over the tokens of ``(..., N, d)``
    keys and values."""
    return state_forward(k, v, phasor_of(cos, sin), feature_map_from_spec(key_map, key_numbers),
                         chunk)


@kernelized_state.register_fake
def _(k, v, cos, sin, key_map, key_numbers, chunk):
    width = feature_map_from_spec(key_map, key_numbers).expansion * k.shape[-1]
    batch = k.shape[:-2]
    return k.new_empty(*batch, width, v.shape[-1]), k.new_empty(*batch, 1, width)


@torch.library.custom_op(f'{STATE_OP}_backward', mutates_args=())
def kernelized_state_backward(d_state: Tensor, d_key_sum: Tensor, k: Tensor, v: Tensor,
                              cos: Optional[Tensor], sin: Optional[Tensor], key_map: str,
                              key_numbers: List[float], chunk: int) -> Tuple[Tensor, Tensor]:
    """Gradients of k and v from those of the state sum and the key sum."""
    return state_backward(d_state, d_key_sum, k, v, phasor_of(cos, sin),
                          feature_map_from_spec(key_map, key_numbers), chunk)


@kernelized_state_backward.register_fake
def _(d_state, d_key_sum, k, v, cos, sin, key_map, key_numbers, chunk):
    return torch.empty_like(k), torch.empty_like(v)


def _state_setup(ctx, inputs, output):
    k, v, cos, sin, key_map, key_numbers, chunk = inputs
    ctx.save_for_backward(k, v, cos, sin)
    ctx.key_map, ctx.key_numbers, ctx.chunk = key_map, key_numbers, chunk


def _state_grad(ctx, d_state, d_key_sum):
    k, v, cos, sin = ctx.saved_tensors
    # an output the loss does not reach comes without a gradient: zero
    if d_state is None:
        width = feature_map_from_spec(ctx.key_map, ctx.key_numbers).expansion * k.shape[-1]
        d_state = k.new_zeros(*k.shape[:-2], width, v.shape[-1])
    if d_key_sum is None:
        d_key_sum = k.new_zeros(*k.shape[:-2], 1, d_state.shape[-2])
    d_k, d_v = kernelized_state_backward(d_state, d_key_sum, k, v, cos, sin, ctx.key_map,
                                         ctx.key_numbers, ctx.chunk)
    return d_k, d_v, None, None, None, None, None


kernelized_state.register_autograd(_state_grad, setup_context=_state_setup)


# ------------------------------------------------------------------------------ readout
@torch.library.custom_op(READOUT_OP, mutates_args=())
def kernelized_readout(q: Tensor, state: Tensor, key_mean: Tensor, cos: Optional[Tensor],
                       sin: Optional[Tensor], query_map: str, query_numbers: List[float],
                       eps: float, chunk: int) -> Tuple[Tensor, Tensor]:
    """``(o, z)``: ``o = rope(phi(q)) S z`` (token-major) and ``z = 1 / (phi(q) kbar^T + eps)``
    ``(..., N, 1)``, from the state mean ``S`` and the key mean ``kbar``."""
    return readout_forward(q, state, key_mean, phasor_of(cos, sin),
                           feature_map_from_spec(query_map, query_numbers), eps, chunk)


@kernelized_readout.register_fake
def _(q, state, key_mean, cos, sin, query_map, query_numbers, eps, chunk):
    return token_major(q, state.shape[-1]), q.new_empty(*q.shape[:-1], 1)


@torch.library.custom_op(f'{READOUT_OP}_backward', mutates_args=())
def kernelized_readout_backward(d_out: Tensor, d_normaliser: Optional[Tensor], q: Tensor,
                                state: Tensor, key_mean: Tensor, normaliser: Tensor,
                                cos: Optional[Tensor], sin: Optional[Tensor], query_map: str,
                                query_numbers: List[float],
                                chunk: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of q, the state mean and the key mean."""
    return readout_backward(d_out, d_normaliser, q, state, key_mean, normaliser,
                            phasor_of(cos, sin), feature_map_from_spec(query_map, query_numbers),
                            chunk)


@kernelized_readout_backward.register_fake
def _(d_out, d_normaliser, q, state, key_mean, normaliser, cos, sin, query_map, query_numbers,
      chunk):
    return torch.empty_like(q), torch.empty_like(state), torch.empty_like(key_mean)


def _readout_setup(ctx, inputs, output):
    q, state, key_mean, cos, sin, query_map, query_numbers, eps, chunk = inputs
    ctx.save_for_backward(q, state, key_mean, output[1], cos, sin)
    ctx.query_map, ctx.query_numbers, ctx.chunk = query_map, query_numbers, chunk


def _readout_grad(ctx, d_out, d_normaliser):
    q, state, key_mean, normaliser, cos, sin = ctx.saved_tensors
    if d_out is None:
        d_out = state.new_zeros(*q.shape[:-1], state.shape[-1])
    d_q, d_state, d_key_mean = kernelized_readout_backward(
        d_out, d_normaliser, q, state, key_mean, normaliser, cos, sin, ctx.query_map,
        ctx.query_numbers, ctx.chunk)
    return d_q, d_state, d_key_mean, None, None, None, None, None, None


kernelized_readout.register_autograd(_readout_grad, setup_context=_readout_setup)


# ------------------------------------------------------------------------------ the fast mode
def kernelized_attention_chunked(q: Tensor, k: Tensor, v: Tensor, query_map: FeatureMap,
                                 key_map: FeatureMap, eps: float = 1e-6, rope: Rope = None,
                                 chunk: int = DEFAULT_CHUNK,
                                 global_keys: Optional[GlobalKeys] = None) -> Tensor:
    """As :func:`.naive.kernelized_attention_naive`, through the two custom ops; ``chunk``
    bounds the tokens processed at once (memory of the temporaries), not the result.
    ``global_keys``: the tokens are this rank's part of a larger set (:mod:`.global_keys`)."""
    if chunk < 1:
        raise ValueError(f'chunk must be >= 1 token, got chunk={chunk}')
    query_rope = rope
    if global_keys is not None:
        k, v, rope = global_keys.own_keys(k, v, rope)
    cos, sin = (None, None) if rope is None else rope
    state, key_sum = kernelized_state(k, v, cos, sin, *feature_map_spec(key_map), chunk)
    if global_keys is None:
        n_tokens = k.shape[-2]
        state, key_mean = state / n_tokens, key_sum / n_tokens
    else:
        state, key_mean = global_keys.means(state, key_sum)
    cos, sin = (None, None) if query_rope is None else query_rope
    out, _ = kernelized_readout(q, state, key_mean, cos, sin, *feature_map_spec(query_map), eps,
                                chunk)
    return out
