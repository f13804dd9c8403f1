"""NaLa inside mmseg's and mmdet's own backbones, a token mixer per stage (per layer in a ViT)
from a config, their stock weights carried over (docs/user_guides/swap.md).

One file per family of stock backbones; importing it registers its backbones:

* :mod:`.swin`: ``NaLaSwinTransformer`` (mmseg);
* :mod:`.spatial_reduction`: ``NaLaMixVisionTransformer`` (mmseg);
* :mod:`.vit`: ``NaLaVisionTransformer`` (mmseg), a mixer per layer.

Where mmdet imports, :mod:`.detection` registers the families' mmdet classes:
``NaLaSwinTransformer`` (:class:`DetNaLaSwinTransformer`), ``NaLaPyramidVisionTransformerV2`` and
ViTDet's ``NaLaVisionTransformer``. Without mmdet they are not defined, and nothing of mmdet is
imported.

What they share (the mixin, the slot a mixer takes, the carry-over of q/k/v and the
projection) is :mod:`.base`.
"""
from ...registry import host_imports
from . import spatial_reduction, swin, vit
from .base import (
                   AttentionLayout,
                   CarryOverReport,
                   SwappedAttention,
                   SwappedAttentionMixin,
                   carry_over,
)
from .spatial_reduction import SPATIAL_REDUCTION_ATTENTION, NaLaMixVisionTransformer
from .swin import SWIN_WINDOW_ATTENTION, SegNaLaSwinTransformer
from .vit import NaLaVisionTransformer

__all__ = [
    'spatial_reduction', 'swin', 'vit', 'AttentionLayout', 'CarryOverReport',
    'SwappedAttention', 'SwappedAttentionMixin',
    'carry_over', 'SPATIAL_REDUCTION_ATTENTION', 'SWIN_WINDOW_ATTENTION',
    'SegNaLaSwinTransformer', 'NaLaMixVisionTransformer', 'NaLaVisionTransformer',
]

if host_imports('mmdet'):
    from . import detection
    from .detection import DetNaLaSwinTransformer, NaLaPyramidVisionTransformerV2
    __all__ += ['detection', 'DetNaLaSwinTransformer', 'NaLaPyramidVisionTransformerV2']
