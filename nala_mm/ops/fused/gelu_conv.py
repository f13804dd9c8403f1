"""The FFN's ``conv(gelu(a))`` as one autograd node that keeps ``a`` only.

Autograd would save both ``a`` (for GELU's backward) and ``gelu(a)`` (the conv's input): two
tensors of the FFN's hidden width, the largest activations of a NaLaFormer block. This node saves
``a`` and recomputes ``gelu(a)`` in its backward (one element-wise pass; the conv is not run
again), so a training step keeps one hidden-width tensor fewer per block.

``mode='reference'`` is the plain composition, differentiated by autograd; ``'fast'`` is the
memory-light node (see :mod:`nala_mm.ops.mode`). Same numbers either way.
"""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..mode import resolve_mode


class _GeluConv(torch.autograd.Function):

    @staticmethod
    def forward(ctx, a: Tensor, weight: Tensor, bias: Optional[Tensor], padding: Sequence[int],
                groups: int):
        hidden = F.gelu(a)
        # the conv runs in the activations' dtype (what autocast would pick); cast here so that
        # the backward, which runs outside autocast, sees the same dtypes
        kernel = weight.to(hidden.dtype)
        out = F.conv2d(hidden, kernel, None if bias is None else bias.to(hidden.dtype),
                       padding=padding, groups=groups)
        ctx.save_for_backward(a, kernel)
        ctx.has_bias, ctx.padding, ctx.groups = bias is not None, padding, groups
        ctx.param_dtype = weight.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        a, weight = ctx.saved_tensors
        hidden = F.gelu(a)  # recomputed instead of stored
        needs = ctx.needs_input_grad
        d_hidden, d_weight, d_bias = torch.ops.aten.convolution_backward(
            d_out, hidden, weight, [weight.shape[0]] if ctx.has_bias else None, [1, 1],
            list(ctx.padding), [1, 1], False, [0, 0], ctx.groups,
            [needs[0], needs[1], ctx.has_bias and needs[2]])
        del hidden
        # written into d_hidden, which nothing else holds: one hidden-width allocation fewer
        # (fresh large blocks cost page faults on CPU)
        d_a = torch.ops.aten.gelu_backward.grad_input(d_hidden, a, grad_input=d_hidden) \
            if needs[0] else None
        d_weight = None if d_weight is None else d_weight.to(ctx.param_dtype)
        d_bias = None if d_bias is None else d_bias.to(ctx.param_dtype)
        return d_a, d_weight, d_bias, None, None


def gelu_conv(a: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
              padding: Sequence[int] = (1, 1), groups: int = 1, mode: str = 'fast') -> Tensor:
    """``conv2d(gelu(a), weight, bias)`` (stride 1, no dilation) on a ``(B, C, H, W)`` map."""
    needs_grad = any(t is not None and t.requires_grad for t in (a, weight, bias))
    # the reference path, or nothing to save for a backward: the plain ops
    if resolve_mode(mode) == 'reference' or not torch.is_grad_enabled() or not needs_grad:
        return F.conv2d(F.gelu(a), weight, bias, padding=tuple(padding), groups=groups)
    return _GeluConv.apply(a, weight, bias, tuple(padding), groups)
