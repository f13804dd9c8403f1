"""The swapped families in mmdet's registry; imported only where mmdet imports
(:func:`nala_mm.registry.host_imports`), so that segmentation needs no mmdet.

* ``NaLaSwinTransformer`` (:class:`DetNaLaSwinTransformer`): the Swin family's mixin
  (:mod:`.swin`) on mmdet's ``SwinTransformer``, with mmdet's ``swin_converter``;
* ``NaLaPyramidVisionTransformerV2``: the spatial-reduction family's mixin
  (:mod:`.spatial_reduction`) on mmdet's PVTv2, with mmdet's ``pvt_convert`` (mmseg configs reach
  it as ``mmdet.NaLaPyramidVisionTransformerV2``);
* ``NaLaVisionTransformer``: mmseg's class of :mod:`.vit` itself, ViTDet's backbone
  (docs/user_guides/vitdet.md).
"""
from mmdet.models.backbones import PyramidVisionTransformerV2
from mmdet.models.backbones import SwinTransformer as MMDetSwinTransformer
from mmdet.models.backbones.pvt import pvt_convert
from mmdet.models.backbones.swin import swin_converter

from ...registry import register_model
from ..state_dicts import backbone_state_dict, state_dict_of
from .spatial_reduction import SpatialReductionStages
from .swin import SWIN_ARGS_DOC, SwinStages
from .vit import NaLaVisionTransformer

register_model(NaLaVisionTransformer, scope='mmdet')


@register_model(scope='mmdet', name='NaLaSwinTransformer')
class DetNaLaSwinTransformer(SwinStages, MMDetSwinTransformer):
    __doc__ = ("mmdet's ``SwinTransformer`` with a token mixer per stage; with "
               "``convert_weights=True`` a checkpoint in the official Swin layout goes through "
               "mmdet's ``swin_converter`` before the carry-over, and one already in mmdet's "
               "layout (a file written from this model or a stock mmdet Swin) does not: "
               "converting it again would rename ``patch_embed.projection`` to "
               "``projectionjection``, which a non-strict load drops silently.\n"
               + SWIN_ARGS_DOC)

    def upstream_state(self, checkpoint):
        state = backbone_state_dict(checkpoint)
        if not self.convert_weights or self.in_own_layout(state):
            return state
        return backbone_state_dict(dict(state_dict=swin_converter(state_dict_of(checkpoint))))


@register_model(scope='mmdet')
class NaLaPyramidVisionTransformerV2(SpatialReductionStages, PyramidVisionTransformerV2):
    """mmdet's ``PyramidVisionTransformerV2`` with a token mixer per stage.

    Args:
        mixers: ``'softmax'`` keeps PVTv2's spatial-reduction attention; ``'nala'``,
            ``'linear'`` or a mixer config attend at full resolution instead (no ``sr`` conv).
        mode: ``'fast'`` or ``'reference'`` for every swapped mixer (:mod:`nala_mm.ops.mode`).
        pretrained_mismatch: what a tensor of the ``Pretrained`` checkpoint whose shape differs
            from the model's does: ``'raise'`` (default) raises a ``ValueError`` naming it and
            both shapes (the stock parent only warns); ``'skip'`` keeps it as initialised and
            logs it, for a deliberate partial load (e.g. ``in_channels=4`` from an RGB file).
        **kwargs: every argument of mmdet's ``PyramidVisionTransformerV2``; with
            ``convert_weights=True`` (its default) a checkpoint in the official PVT layout is
            converted by mmdet's ``pvt_convert`` before the carry-over (one already in mmdet's
            layout is not converted again).
    """

    def upstream_state(self, checkpoint):
        state = backbone_state_dict(checkpoint)
        if not self.convert_weights or self.in_own_layout(state):  # not converted twice
            return state
        return backbone_state_dict(dict(state_dict=pvt_convert(state_dict_of(checkpoint))))
