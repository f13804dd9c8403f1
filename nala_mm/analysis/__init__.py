"""Measuring models: FLOP counts with every token mixer counted (:mod:`.flops`), the attention
statistics of a trained backbone (:mod:`.attention_stats`), and the worker-process protocol the
measurements run in (:mod:`.measure`). A mixer's statistics while it trains (``MixerStatsHook``)
and success rates over seeds serve the long-range study: projects/longrange/."""
from .attention_stats import (
                              LayerStats,
                              analyze_backbone,
                              attention_layers,
                              average_ranks,
                              capture_inputs,
                              entropy_rope,
                              layer_statistics,
                              preprocess,
                              query_entropies,
                              query_token,
                              row_entropy,
                              saturated_share,
                              saturation_norm,
                              spearman,
)
from .flops import (
                              KERNELIZED_OPS,
                              ROPE_FLOPS,
                              SDPA_OP,
                              FlopCount,
                              build_flop_analyzer,
                              count_flops,
                              kernelized_attention_flop_counts,
                              kernelized_readout_flop_jit,
                              kernelized_state_flop_jit,
                              sdpa_flop_jit,
)

__all__ = [
    'KERNELIZED_OPS', 'ROPE_FLOPS', 'SDPA_OP', 'FlopCount', 'build_flop_analyzer', 'count_flops',
    'kernelized_attention_flop_counts', 'kernelized_readout_flop_jit',
    'kernelized_state_flop_jit', 'sdpa_flop_jit',
    'LayerStats', 'analyze_backbone', 'attention_layers', 'average_ranks', 'capture_inputs',
    'entropy_rope', 'layer_statistics', 'preprocess', 'query_entropies', 'query_token',
    'row_entropy', 'saturated_share', 'saturation_norm', 'spearman',
]
