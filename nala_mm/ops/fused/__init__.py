"""The block's CPU nodes: fused GELU + depthwise conv, gated LayerNorm, and convolutions with
faster weight gradients. Each takes ``mode='fast' | 'reference'`` (:mod:`nala_mm.ops.mode`)."""
from .conv_weight_grad import conv2d
from .gated_norm import gated_norm
from .gelu_conv import gelu_conv

__all__ = ['conv2d', 'gated_norm', 'gelu_conv']
