"""The package's math: kernelised attention (:mod:`.attention`), the block's CPU nodes
(:mod:`.fused`), and the one ``mode`` switch they share (:mod:`.mode`).

``__all__`` is the public surface: what the models, the analysis, the tests, the docs and a new
mixer (a :class:`FeatureMap` pair for :func:`kernelized_attention`) use. The modules below hold
the rest (chunk sizes, the sign splits, each mode's own entry).
"""
from .attention import (
                        ChunkedKernelizedAttention,
                        FeatureMap,
                        NaLaConfig,
                        Rope,
                        apply_rope,
                        apply_rope_reference,
                        build_plain_feature_map,
                        kernelized_attention,
                        kernelized_attention_weights,
                        nala_attention,
                        nala_attention_matrix,
                        nala_attention_reference,
                        rope_angle_buffer,
                        rope_frequencies,
                        rope_phasor,
                        rope_table,
                        rope_table_for,
)
from .fused import conv2d, gated_norm, gelu_conv
from .mode import MODES, is_exporting, resolve_mode

__all__ = [
    'MODES', 'ChunkedKernelizedAttention', 'FeatureMap', 'NaLaConfig', 'Rope', 'apply_rope',
    'apply_rope_reference', 'build_plain_feature_map', 'conv2d', 'gated_norm', 'gelu_conv',
    'is_exporting', 'kernelized_attention', 'kernelized_attention_weights', 'nala_attention',
    'nala_attention_matrix', 'nala_attention_reference', 'resolve_mode', 'rope_angle_buffer',
    'rope_frequencies', 'rope_phasor', 'rope_table', 'rope_table_for',
]
