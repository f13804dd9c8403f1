"""The modules that take a stock attention module's place and run a token mixer globally.

Each keeps its host's call signature and its host's dropout contract, so the block around it
(norms, residuals, DropPath, FFN, ``with_cp``) runs unchanged; only the token mixing differs.
"""
from typing import Optional, Sequence

from torch import Tensor, nn

from ..mixers import GatedAttention
from ..nalaformer import build_mixer


def _grid(tokens: Tensor, hw_shape: Sequence[int]) -> Tensor:
    batch, length, channels = tokens.shape
    height, width = hw_shape
    if length != height * width:
        raise ValueError(f'{length} tokens do not form the {height}x{width} grid (hw_shape) '
                         f'they were given with')
    return tokens.reshape(batch, height, width, channels)


class WindowFreeAttention(nn.Module):
    """Swin's ``ShiftWindowMSA`` slot, ``forward(query, hw_shape) -> branch``: the mixer attends
    over the whole stage, with no window partition, shift or window padding. As upstream, the
    output projection's dropout (``proj_drop``) and the block's DropPath (``drop``) follow, and
    the block adds the residual."""

    def __init__(self, mixer: GatedAttention, proj_drop: nn.Module, drop: nn.Module):
        super().__init__()
        self.mixer = mixer  # carry_over.MIXER_ATTR: checkpoints name it so
        self.proj_drop = proj_drop
        self.drop = drop

    def forward(self, query: Tensor, hw_shape: Sequence[int]) -> Tensor:
        mixed = self.mixer(_grid(query, hw_shape))
        return self.drop(self.proj_drop(mixed.flatten(1, 2)))


class FullResolutionAttention(nn.Module):
    """MiT's ``EfficientMultiheadAttention`` / PVTv2's ``SpatialReductionAttention`` slot,
    ``forward(x, hw_shape, identity=None) -> identity + dropout_layer(proj_drop(mixed))``: keys
    and values at full resolution instead of through the spatial-reduction conv. The residual
    is added here, as the upstream module adds it."""

    def __init__(self, mixer: GatedAttention, proj_drop: nn.Module, dropout_layer: nn.Module):
        super().__init__()
        self.mixer = mixer  # carry_over.MIXER_ATTR: checkpoints name it so
        self.proj_drop = proj_drop
        self.dropout_layer = dropout_layer

    def forward(self, x: Tensor, hw_shape: Sequence[int],
                identity: Optional[Tensor] = None) -> Tensor:
        mixed = self.mixer(_grid(x, hw_shape)).flatten(1, 2)
        return (x if identity is None else identity) + self.dropout_layer(self.proj_drop(mixed))


def window_free(stock: nn.Module, mixer_cfg: dict) -> WindowFreeAttention:
    """A Swin ``ShiftWindowMSA`` -> the same sizes and dropouts around a global mixer."""
    window_msa = stock.w_msa
    return WindowFreeAttention(build_mixer(mixer_cfg, window_msa.embed_dims,
                                           window_msa.num_heads),
                               proj_drop=window_msa.proj_drop, drop=stock.drop)


def full_resolution(stock: nn.Module, mixer_cfg: dict) -> FullResolutionAttention:
    """An mmcv ``MultiheadAttention`` with spatial reduction -> a global mixer at full
    resolution, with the same dropouts and residual contract."""
    return FullResolutionAttention(build_mixer(mixer_cfg, stock.embed_dims, stock.num_heads),
                                   proj_drop=stock.proj_drop, dropout_layer=stock.dropout_layer)
