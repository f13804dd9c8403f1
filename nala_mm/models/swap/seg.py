"""NaLa inside mmseg's Swin and SegFormer's MiT, registered in mmseg's registry."""
from typing import Dict, Sequence

from mmseg.models.backbones import MixVisionTransformer, SwinTransformer
from torch import Tensor, nn

from ...registry import register_model
from ..nalaformer import build_mixer
from .adapters import FullResolutionAttention, WindowFreeAttention
from .carry_over import (SPATIAL_REDUCTION_ATTENTION, SWIN_WINDOW_ATTENTION,
                         resize_relative_position_tables)
from .common import DEFAULT_SWAP_MIXERS, StageMixer, SwappedAttentionMixin


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


@register_model(scope='mmseg')
class NaLaSwinTransformer(SwappedAttentionMixin, SwinTransformer):
    """mmseg's ``SwinTransformer`` with a token mixer per stage.

    Args:
        mixers: one entry per stage: ``'softmax'`` keeps Swin's shifted-window attention
            untouched; ``'nala'``, ``'linear'`` or a registered mixer's config put that mixer,
            attending over the whole stage, in every block of the stage. Default: NaLa in the
            two high-resolution stages, as released.
        **kwargs: every argument of mmseg's ``SwinTransformer``. A ``Pretrained`` ``init_cfg``
            of a stock Swin checkpoint carries q/k/v and the projection into the mixers
            (:mod:`nala_mm.models.swap.carry_over`).
    """
    attention_layout = SWIN_WINDOW_ATTENTION

    def __init__(self, mixers: Sequence[StageMixer] = DEFAULT_SWAP_MIXERS, **kwargs):
        super().__init__(**kwargs)
        self._swap_stages(mixers, len(self.stages))

    def _stage_blocks(self, stage):
        return self.stages[stage].blocks

    def _global_attention(self, stock, mixer_cfg):
        return window_free(stock, mixer_cfg)

    def _adapt_state(self, state: Dict[str, Tensor]) -> Dict[str, Tensor]:
        return resize_relative_position_tables(state, self.state_dict())


@register_model(scope='mmseg')
class NaLaMixVisionTransformer(SwappedAttentionMixin, MixVisionTransformer):
    """mmseg's ``MixVisionTransformer`` (SegFormer's MiT) with a token mixer per stage.

    Args:
        mixers: ``'softmax'`` keeps MiT's spatial-reduction attention; ``'nala'``, ``'linear'``
            or a mixer config attend at full resolution instead (no ``sr`` conv).
        **kwargs: every argument of mmseg's ``MixVisionTransformer``.
    """
    attention_layout = SPATIAL_REDUCTION_ATTENTION

    def __init__(self, mixers: Sequence[StageMixer] = DEFAULT_SWAP_MIXERS, **kwargs):
        super().__init__(**kwargs)
        self._swap_stages(mixers, len(self.layers))

    def _stage_blocks(self, stage):
        return self.layers[stage][1]

    def _global_attention(self, stock, mixer_cfg):
        return full_resolution(stock, mixer_cfg)
