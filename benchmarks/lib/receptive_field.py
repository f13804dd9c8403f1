"""How far information travels in a segmentor whose backbone mixes no tokens: the receptive field
of its logits, measured by gradients.

Without token mixing only convolutions and the decoder's resizing move information between
pixels, so the input pixels that can change a pixel's logits lie within a fixed distance of it.
A task that needs long-range context (projects.longrange.data) keeps its cues beyond that
distance, so a model without attention cannot see them.
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn


def conv_reach(segmentor: nn.Module, size: Tuple[int, int], pixels: int = 8,
               seed: int = 0) -> int:
    """The largest Chebyshev distance (input pixels) between an output pixel and an input
    pixel that can change its logits, over a ``pixels x pixels`` block of output pixels at the
    centre of a ``size`` input (every phase of a stride-4 grid, and more).

    ``segmentor`` is an mmseg segmentor (``extract_feat`` and ``decode_head``); it is put in
    eval mode, so BatchNorm uses its running statistics and mixes no pixels. Logits are taken
    at input resolution (bilinear resize), combined over classes with fixed random weights
    (``seed``) so that no class's gradient cancels.
    """
    segmentor.eval()
    height, width = size
    image = torch.randn(1, 3, height, width, requires_grad=True)
    logits = F.interpolate(segmentor.decode_head(segmentor.extract_feat(image)),
                           size=(height, width), mode='bilinear', align_corners=False)
    weights = torch.randn(logits.shape[1], generator=torch.Generator().manual_seed(seed))
    reach = 0
    top, left = height // 2 - pixels // 2, width // 2 - pixels // 2
    for y in range(top, top + pixels):
        for x in range(left, left + pixels):
            grad, = torch.autograd.grad((logits[0, :, y, x] * weights).sum(), image,
                                        retain_graph=True)
            ys, xs = torch.nonzero(grad.abs().sum(dim=(0, 1)) > 0, as_tuple=True)
            reach = max(reach, int((ys - y).abs().max()), int((xs - x).abs().max()))
    return reach
