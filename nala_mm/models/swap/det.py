"""NaLa inside mmdet's Swin and PVTv2, registered in mmdet's registry (mmseg configs reach them
as ``mmdet.NaLaSwinTransformer`` / ``mmdet.NaLaPyramidVisionTransformerV2``)."""
from typing import Dict, Mapping

from mmdet.models.backbones import PyramidVisionTransformerV2, SwinTransformer
from mmdet.models.backbones.pvt import pvt_convert
from mmdet.models.backbones.swin import swin_converter
from torch import Tensor

from ...registry import register_model
from .common import SpatialReductionStages, SwinStages, extract_state, strip_prefixes


@register_model(scope='mmdet')
class NaLaSwinTransformer(SwinStages, SwinTransformer):
    """mmdet's ``SwinTransformer`` with a token mixer per stage (see
    :class:`nala_mm.models.swap.seg.NaLaSwinTransformer`; mmdet's parent differs: it takes
    ``convert_weights`` for the official Swin layout, applied before the carry-over)."""

    def _upstream_state(self, checkpoint: Mapping) -> Dict[str, Tensor]:
        state = extract_state(checkpoint)
        return strip_prefixes(swin_converter(state) if self.convert_weights else state)


@register_model(scope='mmdet')
class NaLaPyramidVisionTransformerV2(SpatialReductionStages, PyramidVisionTransformerV2):
    """mmdet's ``PyramidVisionTransformerV2`` with a token mixer per stage.

    Args:
        mixers: ``'softmax'`` keeps PVTv2's spatial-reduction attention; ``'nala'``,
            ``'linear'`` or a mixer config attend at full resolution instead (no ``sr`` conv).
        **kwargs: every argument of mmdet's ``PyramidVisionTransformerV2``; with
            ``convert_weights=True`` (its default) a checkpoint in the official PVT layout is
            converted by mmdet's ``pvt_convert`` before the carry-over.
    """

    def _upstream_state(self, checkpoint: Mapping) -> Dict[str, Tensor]:
        state = extract_state(checkpoint)
        return strip_prefixes(pvt_convert(state) if self.convert_weights else state)
