"""Convolutions of the NaLaFormer block, on channels-last tokens."""
from typing import Sequence, Tuple

import torch
from torch import Tensor, nn

from ..ops import conv2d, resolve_mode
from ..ops.token_shard import active_shard


def with_row_halo(x: Tensor, padding: Sequence[int]) -> Tuple[Tensor, Tuple[int, int]]:
    """A conv's input and padding, with the neighbouring ranks' rows in place of the row
    padding while an image's rows are split across ranks (:mod:`nala_mm.parallel`): the conv
    then computes this stripe's rows of the whole image's output. Unchanged otherwise."""
    shard = active_shard()
    if shard is None or not padding[0]:
        return x, tuple(padding)
    return shard.halo(x, padding[0]), (0, padding[1])


def conv_tokens(conv: nn.Module, tokens: Tensor) -> Tensor:
    """A conv on channels-last tokens ``(B, H, W, C)``: the tokens' channels-first view is in
    ``torch.channels_last`` memory format, which the conv keeps, so no layout copy is made."""
    return conv(tokens.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class TokenConv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters and names) that trains through the custom op of
    :mod:`nala_mm.ops.fused.conv_weight_grad` (``mode='fast'``: one node under
    ``torch.compile``, the faster CPU weight gradients; ``'reference'`` is ``F.conv2d``)."""

    def __init__(self, *args, mode: str = 'fast', **kwargs):
        super().__init__(*args, **kwargs)
        resolve_mode(mode)  # validates
        self.mode = mode

    def forward(self, x: Tensor) -> Tensor:
        x, padding = with_row_halo(x, self.padding)
        return conv2d(x, self.weight, self.bias, self.stride, padding, self.groups,
                      mode=self.mode)


class ResidualDepthwiseConv(nn.Conv2d):
    """``x + dwconv(x)`` as one depthwise conv: the identity is added to the kernel's centre tap.

    The released block adds every 3x3 depthwise conv's input back (cpe1, cpe2, the FFN's
    dwconv); folding the identity into the kernel computes the same sum without a separate pass
    over the activations (the gradients are the same too: d(w + I)/dw = 1). Parameters and
    their names are the plain conv's, so checkpoints load unchanged.
    """

    def __init__(self, channels: int, kernel_size: int = 3, mode: str = 'fast'):
        super().__init__(channels, channels, kernel_size, padding=kernel_size // 2,
                         groups=channels)
        resolve_mode(mode)  # validates
        self.mode = mode
        identity = torch.zeros(1, 1, kernel_size, kernel_size)
        identity[..., kernel_size // 2, kernel_size // 2] = 1.0
        self.register_buffer('identity', identity, persistent=False)

    def kernel(self) -> Tensor:
        return self.weight + self.identity

    def forward(self, x: Tensor) -> Tensor:
        x, padding = with_row_halo(x, self.padding)
        return conv2d(x, self.kernel(), self.bias, self.stride, padding, self.groups,
                      mode=self.mode)
