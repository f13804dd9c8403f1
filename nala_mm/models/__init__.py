"""Backbone, token mixers, their specs, and the stock backbones with NaLa swapped in; where
mmdet imports, also ViTDet's ``SimpleFPN`` (in mmdet's registry)."""
from ..registry import host_imports
from . import swap  # noqa: E402  (registers the swapped stock backbones)
from .mixer_specs import DEFAULT_HYBRID, SHORTHANDS, build_mixer, mixer_config
from .mixers import (
                     GatedAttention,
                     IdentityAttention,
                     KernelizedMixer,
                     LinearAttention,
                     NormAwareLinearAttention,
                     SoftmaxAttention,
)
from .nalaformer import ARCH_SETTINGS, NaLaFormer
from .pretrained import PRETRAINED, checkpoint_filter, load_pretrained
from .window_attention import WindowSoftmaxAttention

__all__ = ['GatedAttention', 'KernelizedMixer', 'NormAwareLinearAttention', 'LinearAttention',
           'SoftmaxAttention', 'IdentityAttention', 'DEFAULT_HYBRID', 'SHORTHANDS',
           'build_mixer', 'mixer_config', 'NaLaFormer', 'ARCH_SETTINGS', 'PRETRAINED',
           'checkpoint_filter', 'load_pretrained', 'swap', 'WindowSoftmaxAttention']

if host_imports('mmdet'):
    from .simple_fpn import LayerNorm2d, SimpleFPN
    __all__ += ['SimpleFPN', 'LayerNorm2d']
