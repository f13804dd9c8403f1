"""Attention kernels: the plain reference and the fast path of NaLa, and 2D RoPE."""
from .nala_fast import nala_attention
from .nala_reference import KERNELS, NaLaConfig, nala_attention_matrix, nala_attention_reference
from .rope2d import (apply_rope, apply_rope_reference, rope_angle_buffer, rope_frequencies,
                     rope_phasor, rope_table)

__all__ = [
    'KERNELS', 'NaLaConfig', 'nala_attention', 'nala_attention_reference', 'nala_attention_matrix',
    'apply_rope', 'apply_rope_reference', 'rope_angle_buffer', 'rope_frequencies', 'rope_phasor', 'rope_table',
]
