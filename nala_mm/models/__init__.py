"""Backbone and token mixers."""
from .attention import GatedAttention, LinearAttention, NormAwareLinearAttention, SoftmaxAttention
from .checkpoint_filter import filter_authors_checkpoint, load_authors_checkpoint
from .nalaformer import ARCH_SETTINGS, NaLaFormer

__all__ = ['GatedAttention', 'NormAwareLinearAttention', 'LinearAttention', 'SoftmaxAttention',
           'NaLaFormer', 'ARCH_SETTINGS', 'filter_authors_checkpoint', 'load_authors_checkpoint']
