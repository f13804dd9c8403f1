"""The spatial-reduction family: NaLa inside SegFormer's MiT (mmseg) and PVTv2 (mmdet), one mixer
per stage.

Both hold a stage's blocks in ``layers[i][1]`` and attend through mmcv's ``MultiheadAttention``
whose keys and values first pass a strided ``sr`` conv and its ``norm``. A swapped block attends
at full resolution instead (:class:`FullResolutionAttention`; ``sr`` and ``norm`` are dropped
from a checkpoint). Registered: ``NaLaMixVisionTransformer`` in mmseg's registry; PVTv2's
``NaLaPyramidVisionTransformerV2``, in mmdet's, is in :mod:`.detection`.
"""
from typing import Optional, Sequence

from mmseg.models.backbones import MixVisionTransformer
from torch import Tensor

from ...registry import register_model
from ..mixer_specs import build_mixer
from .base import AttentionLayout, SwappedAttention, SwappedAttentionMixin

# mmseg's EfficientMultiheadAttention and mmdet's SpatialReductionAttention: mmcv's
# MultiheadAttention around torch's nn.MultiheadAttention (``attn``), q | k | v in ``in_proj``
SPATIAL_REDUCTION_ATTENTION = AttentionLayout('attn.in_proj_weight', 'attn.in_proj_bias',
                                              'attn.out_proj.weight', 'attn.out_proj.bias')


class FullResolutionAttention(SwappedAttention):
    """MiT's ``EfficientMultiheadAttention`` / PVTv2's ``SpatialReductionAttention`` slot,
    ``forward(x, hw_shape, identity=None) -> identity + dropout_layer(proj_drop(mixed))``: keys
    and values at full resolution instead of through the spatial-reduction conv. The residual
    is added here, as the upstream module adds it."""

    def forward(self, x: Tensor, hw_shape: Sequence[int],
                identity: Optional[Tensor] = None) -> Tensor:
        return (x if identity is None else identity) + self.branch(x, hw_shape)


class SpatialReductionStages(SwappedAttentionMixin):
    """MiT and PVTv2: blocks in ``layers[i][1]``; a swapped block's spatial-reduction attention
    becomes a global mixer at full resolution, with the same dropouts and residual contract."""
    attention_layout = SPATIAL_REDUCTION_ATTENTION

    def _num_units(self):
        return len(self.layers)

    def _unit_blocks(self, unit):
        return self.layers[unit][1]

    def _global_attention(self, stock, mixer_cfg):
        mixer = build_mixer(mixer_cfg, stock.embed_dims, stock.num_heads, self.mode)
        return FullResolutionAttention(mixer, proj_drop=stock.proj_drop,
                                       drop_path=stock.dropout_layer)


@register_model(scope='mmseg')
class NaLaMixVisionTransformer(SpatialReductionStages, MixVisionTransformer):
    """mmseg's ``MixVisionTransformer`` (SegFormer's MiT) with a token mixer per stage.

    Args:
        mixers: ``'softmax'`` keeps MiT's spatial-reduction attention; ``'nala'``, ``'linear'``
            or a mixer config attend at full resolution instead (no ``sr`` conv).
        mode: ``'fast'`` or ``'reference'`` for every swapped mixer (:mod:`nala_mm.ops.mode`).
        pretrained_mismatch: what a tensor of the ``Pretrained`` checkpoint whose shape differs
            from the model's does: ``'raise'`` (default) raises a ``ValueError`` naming it and
            both shapes (the stock parent only warns); ``'skip'`` keeps it as initialised and
            logs it, for a deliberate partial load (e.g. ``in_channels=4`` from an RGB file).
        **kwargs: every argument of mmseg's ``MixVisionTransformer``.
    """
