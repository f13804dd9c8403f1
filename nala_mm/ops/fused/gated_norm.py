"""The mixer's output gate ``LayerNorm(s) * silu(g)`` as one autograd node.

Autograd would keep, besides ``s`` (LayerNorm's input), the normalised output and ``silu(g)``
for the product's backward: two C-wide tensors per token mixer that this node recomputes in its
backward from ``s``, LayerNorm's per-token statistics and ``g`` (which the qkvg projection's
output holds anyway). ``mode='reference'`` is the plain composition, differentiated by autograd
(see :mod:`nala_mm.ops.mode`).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..mode import resolve_mode


class _GatedNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, s: Tensor, gate: Tensor, shape: Tuple[int, ...], weight: Optional[Tensor],
                bias: Optional[Tensor], eps: float):
        normed, mean, rstd = torch.ops.aten.native_layer_norm(s, shape, weight, bias, eps)
        ctx.save_for_backward(s, gate, weight, bias, mean, rstd)
        ctx.shape = shape
        return normed.mul_(F.silu(gate))

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        s, gate, weight, bias, mean, rstd = ctx.saved_tensors
        needs = ctx.needs_input_grad
        shape = ctx.shape
        activated = F.silu(gate)
        d_gate = None
        if needs[1]:
            # recompute LayerNorm's output from its statistics: (s - mean) * rstd * w + b
            normed = (s - mean).mul_(rstd)
            if weight is not None:
                normed = normed.mul_(weight)
            if bias is not None:
                normed = normed.add_(bias)
            d_gate = torch.ops.aten.silu_backward(d_out * normed, gate)
            del normed
        d_s = d_weight = d_bias = None
        if needs[0] or needs[3] or needs[4]:
            d_s, d_weight, d_bias = torch.ops.aten.native_layer_norm_backward(
                d_out * activated, s, shape, mean, rstd, weight, bias,
                [needs[0], weight is not None and needs[3], bias is not None and needs[4]])
        return d_s, d_gate, None, d_weight, d_bias, None


def gated_norm(s: Tensor, gate: Tensor, normalized_shape: Tuple[int, ...],
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5, mode: str = 'fast') -> Tensor:
    """``layer_norm(s, normalized_shape, weight, bias, eps) * silu(gate)``; the shape is given
    as Python ints (as ``F.layer_norm`` takes it) so that tracing exporters see constants."""
    mode = resolve_mode(mode)
    tensors = (s, gate, weight, bias)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                 for t in tensors)
    # under autocast the plain ops get autocast's dtype rules (LayerNorm in float32)
    if mode == 'reference' or not needs_grad or torch.is_autocast_enabled(s.device.type):
        return F.layer_norm(s, normalized_shape, weight, bias, eps) * F.silu(gate)
    return _GatedNorm.apply(s, gate, tuple(normalized_shape), weight, bias, eps)
