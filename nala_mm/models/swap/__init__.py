"""NaLa inside mmseg's and mmdet's own backbones: Swin, SegFormer's MiT and PVTv2 with a token
mixer per stage from a config, their ImageNet weights carried over (docs/swap.md).

``seg`` registers ``NaLaSwinTransformer`` and ``NaLaMixVisionTransformer`` in mmseg's registry,
``det`` ``NaLaSwinTransformer`` and ``NaLaPyramidVisionTransformerV2`` in mmdet's.
"""
from . import det, seg
from .carry_over import (SPATIAL_REDUCTION_ATTENTION, SWIN_WINDOW_ATTENTION, AttentionLayout,
                         CarryOverReport, carry_over)
from .common import resolve_stage_mixers

__all__ = ['seg', 'det', 'carry_over', 'CarryOverReport', 'AttentionLayout',
           'SWIN_WINDOW_ATTENTION', 'SPATIAL_REDUCTION_ATTENTION', 'resolve_stage_mixers']
