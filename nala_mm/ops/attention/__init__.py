"""Kernelised attention (NaLa and plain linear attention): one op, two modes (:mod:`.dispatch`).

``mode='reference'`` is the formula in plain ops (:mod:`.naive`); ``'fast'`` is two custom ops
split at the state, with hand-written backward ops (:mod:`.custom_ops`, kernels in
:mod:`.chunked`). Feature maps are small named objects (:mod:`.feature_maps`), NaLa's settings a
frozen config (:mod:`.config`), positions a 2D RoPE (:mod:`.rope`). The method:
docs/user_guides/method.md.
"""
from .config import NaLaConfig
from .custom_ops import kernelized_readout, kernelized_state
from .dispatch import (
                       kernelized_attention,
                       nala_attention,
)
from .feature_maps import FeatureMap, build_plain_feature_map
from .global_keys import GlobalKeys
from .naive import kernelized_attention_weights
from .rope import (
                       Rope,
                       apply_rope,
                       apply_rope_reference,
                       rope_angle_buffer,
                       rope_frequencies,
                       rope_phasor,
                       rope_table,
                       rope_table_for,
)

__all__ = [
    'FeatureMap', 'GlobalKeys', 'NaLaConfig', 'Rope', 'apply_rope', 'apply_rope_reference',
    'build_plain_feature_map', 'kernelized_attention', 'kernelized_attention_weights',
    'kernelized_readout', 'kernelized_state', 'nala_attention', 'rope_angle_buffer',
    'rope_frequencies', 'rope_phasor', 'rope_table', 'rope_table_for',
]
