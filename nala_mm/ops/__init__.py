"""Attention math: feature maps, kernelised attention (fast and reference modes), NaLa's
configuration, 2D RoPE, and the released op order for comparisons."""
from .export import is_exporting
from .feature_maps import (PLAIN_FEATURE_MAPS, SIGN_SPLITS, FeatureMap, build_plain_feature_map,
                           build_sign_split)
from .gated_norm import gated_norm
from .gelu_conv import gelu_conv
from .kernelized import (MODES, kernelized_attention, kernelized_attention_reference,
                         kernelized_attention_weights)
from .nala import (KERNELS, NaLaConfig, nala_attention, nala_attention_matrix,
                   nala_attention_reference)
from .rope2d import (apply_rope, apply_rope_reference, rope_angle_buffer,
                     rope_frequencies, rope_phasor, rope_table)

__all__ = [
    'is_exporting', 'PLAIN_FEATURE_MAPS', 'SIGN_SPLITS', 'FeatureMap', 'build_plain_feature_map',
    'build_sign_split', 'gated_norm', 'gelu_conv', 'MODES', 'kernelized_attention', 'kernelized_attention_reference',
    'kernelized_attention_weights', 'KERNELS', 'NaLaConfig', 'nala_attention',
    'nala_attention_matrix', 'nala_attention_reference', 'apply_rope',
    'apply_rope_reference', 'rope_angle_buffer', 'rope_frequencies', 'rope_phasor', 'rope_table',
]
