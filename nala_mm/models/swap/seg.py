"""NaLa inside mmseg's Swin and SegFormer's MiT, registered in mmseg's registry."""
from mmseg.models.backbones import MixVisionTransformer, SwinTransformer

from ...registry import register_model
from .common import SpatialReductionStages, SwinStages


@register_model(scope='mmseg')
class NaLaSwinTransformer(SwinStages, SwinTransformer):
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


@register_model(scope='mmseg')
class NaLaMixVisionTransformer(SpatialReductionStages, MixVisionTransformer):
    """mmseg's ``MixVisionTransformer`` (SegFormer's MiT) with a token mixer per stage.

    Args:
        mixers: ``'softmax'`` keeps MiT's spatial-reduction attention; ``'nala'``, ``'linear'``
            or a mixer config attend at full resolution instead (no ``sr`` conv).
        **kwargs: every argument of mmseg's ``MixVisionTransformer``.
    """
