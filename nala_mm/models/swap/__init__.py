"""NaLa inside mmseg's and mmdet's own backbones, a token mixer per stage (per layer in a ViT)
from a config, their stock weights carried over (docs/swap.md).

One file per family of stock backbones; importing it registers its backbones:

* :mod:`.swin`: ``NaLaSwinTransformer`` (mmseg and mmdet);
* :mod:`.spatial_reduction`: ``NaLaMixVisionTransformer`` (mmseg),
  ``NaLaPyramidVisionTransformerV2`` (mmdet);
* :mod:`.vit`: ``NaLaVisionTransformer`` (mmseg), a mixer per layer.

What they share (the mixin, the slot a mixer takes, the carry-over of q/k/v and the
projection) is :mod:`.base`.
"""
from . import spatial_reduction, swin, vit
from .base import (
                   AttentionLayout,
                   CarryOverReport,
                   SwappedAttention,
                   SwappedAttentionMixin,
                   carry_over,
)
from .spatial_reduction import (
                   SPATIAL_REDUCTION_ATTENTION,
                   NaLaMixVisionTransformer,
                   NaLaPyramidVisionTransformerV2,
)
from .swin import SWIN_WINDOW_ATTENTION, DetNaLaSwinTransformer, SegNaLaSwinTransformer
from .vit import NaLaVisionTransformer

__all__ = [
    'spatial_reduction', 'swin', 'vit', 'AttentionLayout', 'CarryOverReport',
    'SwappedAttention', 'SwappedAttentionMixin',
    'carry_over', 'SPATIAL_REDUCTION_ATTENTION', 'SWIN_WINDOW_ATTENTION',
    'SegNaLaSwinTransformer', 'DetNaLaSwinTransformer', 'NaLaMixVisionTransformer',
    'NaLaPyramidVisionTransformerV2', 'NaLaVisionTransformer',
]
