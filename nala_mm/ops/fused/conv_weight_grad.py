"""Convolutions on channels-last tokens with a faster weight gradient on CPU.

oneDNN (PyTorch's CPU convolutions) computes the forward and the input gradient of the block's
convolutions quickly in ``channels_last`` memory, but two weight gradients slowly (its generic
``backward_weights`` kernel, visible with ``ONEDNN_VERBOSE=1``). This module takes other routes
for those two (timings: ``benchmarks/speed/conv_weight_grad.py``, docs/reports/speed.md):

* dense convs (the 3x3/s2 downsamples): the weight gradient is computed on channels-first
  copies of the input and the output gradient;
* depthwise 5x5 (LePE): four 3x3 depthwise weight gradients, which oneDNN runs with its
  depthwise kernel, over windows of the padded input cover the 5x5 taps (offsets {-2..0} x
  {-2..0}, ..., {0..2} x {0..2}); below ``SPLIT_MIN_PIXELS`` oneDNN's direct kernel is as fast
  and is kept.

``mode='fast'`` runs the forward as ``F.conv2d`` in one custom op, ``nala_mm::conv2d``, whose
backward op picks those paths on CPU in float32 and ATen's elsewhere (``torch.compile`` keeps
both as nodes); ``'reference'`` is ``F.conv2d`` differentiated by autograd. Same numbers (sums
in another order). Without gradients or while exporting, both are ``F.conv2d``.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..mode import resolve_mode
from .layout import laid_out_like

# Below this many pixels per map oneDNN's own depthwise 5x5 weight gradient is as fast as four
# 3x3 ones (benchmarks/speed/conv_weight_grad.py).
SPLIT_MIN_PIXELS = 96 * 96
_convolution_backward = torch.ops.aten.convolution_backward


def _is_channels_last(x: Tensor) -> bool:
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def _weight_grad_onednn(d_out: Tensor, x: Tensor, weight: Tensor, stride: Tuple[int, int],
                        padding: Tuple[int, int], groups: int) -> Tensor:
    return _convolution_backward(d_out, x, weight, None, list(stride), list(padding), [1, 1],
                                 False, [0, 0], groups, [False, True, False])[1]


def depthwise_weight_grad_by_3x3(d_out: Tensor, x: Tensor, kernel_size: int) -> Tensor:
    """Weight gradient of a stride-1, 'same'-padded depthwise ``k x k`` conv (k odd, >= 3) as
    depthwise 3x3 weight gradients over windows of the padded input.

    The ``(H+2) x (W+2)`` window starting at ``(a, b)`` of the input padded by ``k // 2``
    holds the taps at offsets ``a..a+2`` x ``b..b+2`` of the ``k x k`` kernel; windows at even
    starts cover all of them (the overlapping taps come out equal). Each window is written
    into one reused buffer in the input's memory format, its zero border refreshed, so the
    transient memory is one input-sized buffer, not a padded copy besides it.
    """
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    pad = kernel_size // 2
    memory_format = torch.channels_last if _is_channels_last(x) else torch.contiguous_format
    window = torch.empty((x.shape[0], channels, height + 2, width + 2), dtype=x.dtype,
                         device=x.device, memory_format=memory_format)
    kernel_3x3 = x.new_empty(channels, 1, 3, 3)  # only its shape is read
    grad = x.new_empty(channels, 1, kernel_size, kernel_size)

    def span(start: int, size: int):
        """Window rows [lo, hi) holding input rows [lo + start - pad, hi + start - pad)."""
        lo, hi = max(pad - start, 0), min(size + pad - start, size + 2)
        return slice(lo, hi), slice(lo + start - pad, hi + start - pad)

    starts = range(0, kernel_size - 2, 2)
    for a in starts:
        rows, x_rows = span(a, height)
        for b in starts:
            cols, x_cols = span(b, width)
            window[:, :, rows, cols] = x[:, :, x_rows, x_cols]
            # zero only the border this window's copy leaves (at most two rows/cols a side)
            for border in (window[:, :, :rows.start], window[:, :, rows.stop:],
                           window[:, :, :, :cols.start], window[:, :, :, cols.stop:]):
                border.zero_()
            grad[:, :, a:a + 3, b:b + 3] = _weight_grad_onednn(d_out, window, kernel_3x3, (1, 1),
                                                               (0, 0), channels)
    return grad


def conv_weight_grad(d_out: Tensor, x: Tensor, weight: Tensor, stride: Tuple[int, int],
                     padding: Tuple[int, int], groups: int) -> Tensor:
    """The weight gradient of ``F.conv2d(x, weight, None, stride, padding, groups=groups)``,
    by the fastest path measured on CPU (module docstring)."""
    kernel_size = weight.shape[-1]
    depthwise = groups == x.shape[1] == weight.shape[0] and weight.shape[1] == 1
    if (depthwise and kernel_size > 3 and kernel_size % 2 == 1
            and weight.shape[-2] == kernel_size and tuple(stride) == (1, 1)
            and tuple(padding) == (kernel_size // 2,) * 2
            and x.shape[2] * x.shape[3] >= SPLIT_MIN_PIXELS):
        return depthwise_weight_grad_by_3x3(d_out, x, kernel_size)
    if groups == 1 and _is_channels_last(x):
        return _weight_grad_onednn(d_out.contiguous(), x.contiguous(), weight, stride, padding,
                                   groups)
    return _weight_grad_onednn(d_out, x, weight, stride, padding, groups)


@torch.library.custom_op('nala_mm::conv2d', mutates_args=())
def conv2d_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int],
              padding: List[int], groups: int) -> Tensor:
    """``F.conv2d`` (no dilation) in the inputs' dtype; its backward op takes the paths of the
    module docstring."""
    with torch.autocast(x.device.type, enabled=False):
        return F.conv2d(x, weight, bias, stride, padding, 1, groups)


@conv2d_op.register_fake
def _(x, weight, bias, stride, padding, groups):
    with torch.autocast(x.device.type, enabled=False):
        return F.conv2d(x, weight, bias, stride, padding, 1, groups)


@torch.library.custom_op('nala_mm::conv2d_backward', mutates_args=())
def conv2d_backward(d_out: Tensor, x: Tensor, weight: Tensor, stride: List[int],
                    padding: List[int], groups: int,
                    output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of x, the weight and the bias; an output ``output_mask`` leaves out is an empty
    tensor. Float32 on CPU takes the weight-gradient paths of the module docstring, everything
    else ATen's ``convolution_backward``. The bias gradient is the output gradient's sum:
    asked of ``convolution_backward`` together with the input gradient but not the weight's
    (which the CPU path computes apart), ATen takes ten times as long as for the input gradient
    alone (a depthwise 5x5 at 2 x 64 x 128 x 128, channels-last, torch 2.13)."""
    d_x, d_weight, d_bias = (x.new_empty(0) for _ in range(3))  # distinct: outputs never alias
    fast_weight_grad = x.device.type == 'cpu' and x.dtype == torch.float32
    with torch.autocast(x.device.type, enabled=False):
        if output_mask[0] or (output_mask[1] and not fast_weight_grad):
            d_x_aten, d_weight_aten, _ = _convolution_backward(
                d_out, x, weight, None, list(stride), list(padding), [1, 1], False, [0, 0],
                groups, [output_mask[0], output_mask[1] and not fast_weight_grad, False])
        if output_mask[0]:
            d_x = laid_out_like(d_x_aten, x)
        if output_mask[1]:
            d_weight = laid_out_like(
                conv_weight_grad(d_out, x, weight, tuple(stride), tuple(padding), groups)
                if fast_weight_grad else d_weight_aten, weight)
        if output_mask[2]:
            d_bias = d_out.sum((0, 2, 3))
    return d_x, d_weight, d_bias


@conv2d_backward.register_fake
def _(d_out, x, weight, stride, padding, groups, output_mask):
    d_x = torch.empty_like(x) if output_mask[0] else x.new_empty(0)
    d_weight = torch.empty_like(weight) if output_mask[1] else x.new_empty(0)
    d_bias = d_out.new_empty(weight.shape[0]) if output_mask[2] else x.new_empty(0)
    return d_x, d_weight, d_bias


def _setup(ctx, inputs, output):
    x, weight, bias, stride, padding, groups = inputs
    ctx.save_for_backward(x, weight)
    ctx.stride, ctx.padding, ctx.groups, ctx.has_bias = stride, padding, groups, bias is not None


def _grad(ctx, d_out):
    x, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad
    mask = [needs[0], needs[1], ctx.has_bias and needs[2]]
    grads = conv2d_backward(d_out, x, weight, ctx.stride, ctx.padding, ctx.groups, mask)
    return (*(g if needed else None for g, needed in zip(grads, mask)), None, None, None)


conv2d_op.register_autograd(_grad, setup_context=_setup)


def autocast_inputs(*tensors: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
    """``tensors`` in the dtype autocast gives a convolution on their device (unchanged without
    autocast): the custom ops compute in their inputs' dtype, so the cast autocast would make
    inside ``F.conv2d`` is made here, in the caller's graph."""
    device = next(t for t in tensors if t is not None).device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(None if t is None else t.to(dtype) for t in tensors)


def conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
           stride: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0), groups: int = 1,
           mode: str = 'fast') -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, groups=groups)`` (no dilation, numeric
    padding). ``mode='fast'`` runs the custom op when a gradient is needed: compiled, inductor
    keeps it as a node (its own convolution backward lowering specialises on the input size;
    the op's does not), and on CPU in float32 its backward takes the weight-gradient paths of
    the module docstring."""
    mode = resolve_mode(mode, traceable=True)
    stride, padding = tuple(stride), tuple(padding)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias))
    if mode == 'reference' or not needs_grad:
        return F.conv2d(x, weight, bias, stride, padding, 1, groups)
    return conv2d_op(*autocast_inputs(x, weight, bias), list(stride), list(padding), groups)
