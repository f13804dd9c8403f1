"""NaLa inside mmdet's Swin and PVTv2, registered in mmdet's registry (mmseg configs reach them
as ``mmdet.NaLaSwinTransformer`` / ``mmdet.NaLaPyramidVisionTransformerV2``)."""
from typing import Dict, Mapping, Sequence

from mmdet.models.backbones import PyramidVisionTransformerV2, SwinTransformer
from mmdet.models.backbones.pvt import pvt_convert
from mmdet.models.backbones.swin import swin_converter
from torch import Tensor

from ...registry import register_model
from .carry_over import (SPATIAL_REDUCTION_ATTENTION, SWIN_WINDOW_ATTENTION,
                         resize_relative_position_tables)
from .common import (DEFAULT_SWAP_MIXERS, StageMixer, SwappedAttentionMixin, extract_state,
                     strip_prefixes)
from .seg import full_resolution, window_free


@register_model(scope='mmdet')
class NaLaSwinTransformer(SwappedAttentionMixin, SwinTransformer):
    """mmdet's ``SwinTransformer`` with a token mixer per stage (see
    :class:`nala_mm.models.swap.seg.NaLaSwinTransformer`; mmdet's parent differs: it takes
    ``convert_weights`` for the official Swin layout, applied before the carry-over)."""
    attention_layout = SWIN_WINDOW_ATTENTION

    def __init__(self, mixers: Sequence[StageMixer] = DEFAULT_SWAP_MIXERS, **kwargs):
        super().__init__(**kwargs)
        self._swap_stages(mixers, len(self.stages))

    def _stage_blocks(self, stage):
        return self.stages[stage].blocks

    def _global_attention(self, stock, mixer_cfg):
        return window_free(stock, mixer_cfg)

    def _upstream_state(self, checkpoint: Mapping) -> Dict[str, Tensor]:
        state = extract_state(checkpoint)
        return strip_prefixes(swin_converter(state) if self.convert_weights else state)

    def _adapt_state(self, state: Dict[str, Tensor]) -> Dict[str, Tensor]:
        return resize_relative_position_tables(state, self.state_dict())


@register_model(scope='mmdet')
class NaLaPyramidVisionTransformerV2(SwappedAttentionMixin, PyramidVisionTransformerV2):
    """mmdet's ``PyramidVisionTransformerV2`` with a token mixer per stage.

    Args:
        mixers: ``'softmax'`` keeps PVTv2's spatial-reduction attention; ``'nala'``,
            ``'linear'`` or a mixer config attend at full resolution instead (no ``sr`` conv).
        **kwargs: every argument of mmdet's ``PyramidVisionTransformerV2``; with
            ``convert_weights=True`` (its default) a checkpoint in the official PVT layout is
            converted by mmdet's ``pvt_convert`` before the carry-over.
    """
    attention_layout = SPATIAL_REDUCTION_ATTENTION

    def __init__(self, mixers: Sequence[StageMixer] = DEFAULT_SWAP_MIXERS, **kwargs):
        super().__init__(**kwargs)
        self._swap_stages(mixers, len(self.layers))

    def _stage_blocks(self, stage):
        return self.layers[stage][1]

    def _global_attention(self, stock, mixer_cfg):
        return full_resolution(stock, mixer_cfg)

    def _upstream_state(self, checkpoint: Mapping) -> Dict[str, Tensor]:
        state = extract_state(checkpoint)
        return strip_prefixes(pvt_convert(state) if self.convert_weights else state)
