"""The package's math: kernelised attention (:mod:`.attention`), the block's CPU nodes
(:mod:`.fused`), and the one ``mode`` switch they share (:mod:`.mode`)."""
from .attention import (DEFAULT_CHUNK, KERNELS, PLAIN_FEATURE_MAPS, SIGN_SPLITS,
                        ChunkedKernelizedAttention, FeatureMap, NaLaConfig, Rope, apply_rope,
                        apply_rope_reference, build_plain_feature_map, build_sign_split,
                        kernelized_attention, kernelized_attention_chunked,
                        kernelized_attention_naive, kernelized_attention_weights,
                        nala_attention, nala_attention_matrix, nala_attention_reference,
                        rope_angle_buffer, rope_frequencies, rope_phasor, rope_table,
                        rope_table_for)
from .fused import conv2d, gated_norm, gelu_conv
from .mode import MODES, is_exporting, resolve_mode

__all__ = [
    'DEFAULT_CHUNK', 'KERNELS', 'MODES', 'PLAIN_FEATURE_MAPS', 'SIGN_SPLITS',
    'ChunkedKernelizedAttention', 'FeatureMap', 'NaLaConfig', 'Rope', 'apply_rope',
    'apply_rope_reference', 'build_plain_feature_map', 'build_sign_split', 'conv2d',
    'gated_norm', 'gelu_conv', 'is_exporting', 'kernelized_attention',
    'kernelized_attention_chunked', 'kernelized_attention_naive', 'kernelized_attention_weights',
    'nala_attention', 'nala_attention_matrix', 'nala_attention_reference', 'resolve_mode',
    'rope_angle_buffer', 'rope_frequencies', 'rope_phasor', 'rope_table', 'rope_table_for',
]
