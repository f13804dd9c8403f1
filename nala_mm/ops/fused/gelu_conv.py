"""The FFN's ``conv(gelu(a))`` as one custom op that keeps ``a`` only.

Autograd would save both ``a`` (for GELU's backward) and ``gelu(a)`` (the conv's input): two
tensors of the FFN's hidden width, the largest activations of a NaLaFormer block. The op
``nala_mm::gelu_conv`` saves ``a`` and its backward op recomputes ``gelu(a)`` (one element-wise
pass; the conv is not run again), so a training step keeps one hidden-width tensor fewer per
block. Both are torch custom ops: ``torch.compile`` keeps them as nodes.

``mode='reference'`` is the plain composition, differentiated by autograd; ``'fast'`` is the
memory-light op (see :mod:`nala_mm.ops.mode`). Same numbers either way.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..mode import resolve_mode
from .conv_weight_grad import autocast_inputs
from .layout import laid_out_like


def _kernel(a: Tensor, weight: Tensor) -> Tensor:
    # the conv runs in the activations' dtype (what autocast would pick); the op casts its weight
    # itself, so the backward, which runs outside autocast, sees the same dtypes
    return weight.to(a.dtype)


@torch.library.custom_op('nala_mm::gelu_conv', mutates_args=())
def gelu_conv_op(a: Tensor, weight: Tensor, bias: Optional[Tensor], padding: List[int],
                 groups: int) -> Tensor:
    """``conv2d(gelu(a), weight, bias)``, stride 1, in ``a``'s dtype."""
    with torch.autocast(a.device.type, enabled=False):
        return F.conv2d(F.gelu(a), _kernel(a, weight),
                        None if bias is None else bias.to(a.dtype), padding=padding,
                        groups=groups)


@gelu_conv_op.register_fake
def _(a, weight, bias, padding, groups):
    with torch.autocast(a.device.type, enabled=False):
        return F.conv2d(a, _kernel(a, weight), None, padding=padding, groups=groups)


@torch.library.custom_op('nala_mm::gelu_conv_backward', mutates_args=())
def gelu_conv_backward(d_out: Tensor, a: Tensor, weight: Tensor, padding: List[int],
                       groups: int, output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``a``, the weight (its dtype) and the bias; an output ``output_mask``
    leaves out is an empty tensor."""
    with torch.autocast(a.device.type, enabled=False):
        kernel = _kernel(a, weight)
        hidden = F.gelu(a)  # recomputed instead of stored
        d_hidden, d_weight, d_bias = torch.ops.aten.convolution_backward(
            d_out, hidden, kernel, [weight.shape[0]], [1, 1], list(padding), [1, 1], False,
            [0, 0], groups, list(output_mask))
        del hidden
        # written into d_hidden, which nothing else holds: one hidden-width allocation fewer
        # (fresh large blocks cost page faults on CPU)
        d_a = (laid_out_like(torch.ops.aten.gelu_backward.grad_input(
            d_hidden, a, grad_input=d_hidden), a) if output_mask[0] else a.new_empty(0))
    d_weight = d_weight.to(weight.dtype) if output_mask[1] else weight.new_empty(0)
    d_bias = d_bias.to(weight.dtype) if output_mask[2] else weight.new_empty(0)
    return d_a, d_weight, d_bias


@gelu_conv_backward.register_fake
def _(d_out, a, weight, padding, groups, output_mask):
    shapes = [(a, a.shape), (weight, weight.shape), (weight, (weight.shape[0],))]
    return tuple(torch.empty_like(like) if like is a and needed else
                 like.new_empty(shape if needed else (0,))
                 for (like, shape), needed in zip(shapes, output_mask))


def _setup(ctx, inputs, output):
    a, weight, bias, padding, groups = inputs
    ctx.save_for_backward(a, weight)
    ctx.padding, ctx.groups, ctx.has_bias = padding, groups, bias is not None


def _grad(ctx, d_out):
    a, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad
    mask = [needs[0], needs[1], ctx.has_bias and needs[2]]
    grads = gelu_conv_backward(d_out, a, weight, ctx.padding, ctx.groups, mask)
    return (*(g if needed else None for g, needed in zip(grads, mask)), None, None)


gelu_conv_op.register_autograd(_grad, setup_context=_setup)


def gelu_conv(a: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
              padding: Sequence[int] = (1, 1), groups: int = 1, mode: str = 'fast') -> Tensor:
    """``conv2d(gelu(a), weight, bias)`` (stride 1, no dilation) on a ``(B, C, H, W)`` map."""
    needs_grad = any(t is not None and t.requires_grad for t in (a, weight, bias))
    # the reference path, or nothing to save for a backward: the plain ops
    if (resolve_mode(mode, traceable=True) == 'reference' or not torch.is_grad_enabled()
            or not needs_grad):
        return F.conv2d(F.gelu(a), weight, bias, padding=tuple(padding), groups=groups)
    return gelu_conv_op(*autocast_inputs(a, weight, bias), list(padding), groups)
