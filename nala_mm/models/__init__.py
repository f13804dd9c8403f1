"""Backbone and token mixers."""
from .mixers import (GatedAttention, IdentityAttention, LinearAttention, NormAwareLinearAttention,
                     SoftmaxAttention)
from .pretrained import PRETRAINED, checkpoint_filter, load_pretrained
from .nalaformer import ARCH_SETTINGS, NaLaFormer
from . import swap  # noqa: F401,E402  (registers the swapped stock backbones)

__all__ = ['GatedAttention', 'NormAwareLinearAttention', 'LinearAttention', 'SoftmaxAttention',
           'IdentityAttention',
           'NaLaFormer', 'ARCH_SETTINGS', 'PRETRAINED', 'checkpoint_filter', 'load_pretrained']
