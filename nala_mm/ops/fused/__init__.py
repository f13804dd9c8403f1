"""The block's CPU nodes: fused GELU + depthwise conv and convolutions with faster weight
gradients. Each takes ``mode='fast' | 'reference'`` (:mod:`nala_mm.ops.mode`)."""
from .conv_weight_grad import conv2d
from .gelu_conv import gelu_conv

__all__ = ['conv2d', 'gelu_conv']
