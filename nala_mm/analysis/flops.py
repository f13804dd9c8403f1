"""FLOP counting for NaLaFormer models, on top of :mod:`mmengine.analysis` (JIT-trace based).

Convention (mmengine's, from fvcore): one multiply-add is one flop; linear layers, convolutions
and matmuls count their multiply-adds, norms a few flops per element, and element-wise ops
(activations, residual adds, softmax) count nothing. mmengine has no handle for two ops of this
model, so they would count 0; this module adds them:

* ``aten::scaled_dot_product_attention`` (:class:`~nala_mm.models.SoftmaxAttention`): ``q k^T``
  plus ``A v``, ``B*h*N_q*N_k*(d + d_v)`` = ``2*B*h*N^2*d``; the softmax itself counts 0, like
  everywhere else.
* The fast kernelised attention (NaLa and plain linear attention), two custom ops
  (:data:`KERNELIZED_OPS`, :mod:`nala_mm.ops.attention.custom_ops`): the state op over the keys
  and the readout op over the queries. Each map travels as the op's name and numbers, so the
  handles read the feature width ``e*d`` (``e`` = 2 for NaLa's split kernels, 1 for its
  positive part and for plain linear attention) and each map's element-wise cost.
  Per (batch, head), with N tokens and head dim d, they count

  under ``attn_matmul`` (what the reference mode's matmuls add up to):
    * state ``S = G_k^T v``                        N*e*d*d   (state op)
    * numerator ``G_q S``                          N*e*d*d   (readout op)
    * normaliser dot ``phi(q) . mean_j phi(k_j)``  N*e*d     (readout op)

  under ``attn_elementwise`` (work the stock convention would ignore; each term is output
  elements x a per-element constant):
    * key sum ``sum_j phi(k_j)``                   N*e*d  (one add per element; state op)
    * features ``phi(k)`` and ``phi(q)``           (c_k + c_q) * N*e*d  (``c``: each map's
                                                   ``flops_per_feature``; state, readout op)
    * RoPE on ``phi(k)`` and ``phi(q)``            2 * ROPE_FLOPS * N*e*d  (only with RoPE;
                                                   half in each op)
    * scaling the output by ``z``                  N*d    (readout op)

  For NaLa (e = 2, c = 4) that is ``4*N*d^2 + 29*N*d`` with RoPE, the leading ``4*N*d^2`` of
  docs/user_guides/method.md ('Cost').

The reference mode (``mode='reference'``, and every mixer while exporting) is made of ordinary
ops, so stock mmengine counts it: its ``matmul`` total equals the fast node's ``attn_matmul``
exactly, while its element-wise work counts 0 there, as for any other model.

:func:`count_flops` is the one entry point (``tools/get_flops.py`` and the benchmarks use it).
The counts of the model variants against the paper's: docs/reports/fidelity.md, 'FLOPs'.
"""
from collections import Counter
from dataclasses import dataclass
from math import prod
from typing import Any, Dict, List, Tuple

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import get_shape
from mmengine.analysis.print_helper import complexity_stats_table
from torch import nn

from ..ops import FeatureMap
from ..ops.attention.custom_ops import READOUT_OP, STATE_OP
from ..ops.attention.feature_maps import feature_map_from_spec

# Per rotated output element: ``x cos - y sin`` (or ``x sin + y cos``) is two multiply-adds.
ROPE_FLOPS = 2

# the traced nodes of the fast kernelised attention: the state op, then the readout op
KERNELIZED_OPS = (STATE_OP, READOUT_OP)
SDPA_OP = 'aten::scaled_dot_product_attention'


def _state_counts(n: int, d: int, key_map: FeatureMap, rope: bool) -> Tuple[int, int]:
    """(matmul, element-wise) flops of the state op per (batch, head)."""
    width = key_map.expansion * d
    elementwise = n * width + key_map.flops_per_feature * n * width
    return n * width * d, elementwise + (ROPE_FLOPS * n * width if rope else 0)


def _readout_counts(n: int, d: int, query_map: FeatureMap, width: int,
                    rope: bool) -> Tuple[int, int]:
    """(matmul, element-wise) flops of the readout op per (batch, head); ``width`` = e*d."""
    elementwise = query_map.flops_per_feature * n * width + n * d
    return n * width * d + n * width, elementwise + (ROPE_FLOPS * n * width if rope else 0)


def kernelized_attention_flop_counts(n_tokens: int, head_dim: int, heads: int,
                                     query_map: FeatureMap, key_map: FeatureMap,
                                     batch: int = 1, rope: bool = True) -> Counter:
    """Flops of one kernelised attention call split into ``attn_matmul`` and
    ``attn_elementwise`` (module doc): the state op's and the readout op's together."""
    state = _state_counts(n_tokens, head_dim, key_map, rope)
    readout = _readout_counts(n_tokens, head_dim, query_map, key_map.expansion * head_dim, rope)
    groups = batch * heads
    return Counter(attn_matmul=groups * (state[0] + readout[0]),
                   attn_elementwise=groups * (state[1] + readout[1]))


def _shapes(values: List[Any]) -> List[List[int]]:
    shapes = [get_shape(v) for v in values]
    if any(s is None for s in shapes):
        raise ValueError('attention flop handle: an input has no complete shape in the trace')
    return shapes


def _constant(value: Any) -> Any:
    """A traced node's constant argument (a list built from constants included)."""
    node = value.node()
    if node.kind() == 'prim::ListConstruct':
        return [_constant(item) for item in node.inputs()]
    return value.toIValue()


def _feature_map(inputs: List[Any], at: int) -> FeatureMap:
    """The map whose registered name and numbers are the node's arguments ``at`` and ``at+1``."""
    return feature_map_from_spec(_constant(inputs[at]), _constant(inputs[at + 1]))


def _has_rope(inputs: List[Any], at: int) -> bool:
    """Whether the node's ``cos`` argument (at ``at``) is a table, not ``None``."""
    cos = inputs[at]
    return not (cos.node().kind() == 'prim::Constant' and cos.toIValue() is None)


def kernelized_state_flop_jit(inputs: List[Any], outputs: List[Any]) -> Counter:
    """Handle for ``nala_mm::kernelized_state(k, v, cos, sin, key_map, key_numbers, chunk)``."""
    k_shape, v_shape = _shapes(inputs[:2])
    if k_shape[:-1] != v_shape[:-1]:
        raise ValueError(f'kernelised state flop handle expects k, v with one token grid, got '
                         f'{k_shape}, {v_shape}')
    *groups, n_tokens, head_dim = k_shape
    matmul, elementwise = _state_counts(n_tokens, head_dim, _feature_map(inputs, 4),
                                        _has_rope(inputs, 2))
    return Counter(attn_matmul=prod(groups) * matmul, attn_elementwise=prod(groups) * elementwise)


def kernelized_readout_flop_jit(inputs: List[Any], outputs: List[Any]) -> Counter:
    """Handle for ``nala_mm::kernelized_readout(q, state, key_mean, cos, sin, query_map,
    query_numbers, eps, chunk)``."""
    q_shape, state_shape = _shapes(inputs[:2])
    *groups, n_tokens, head_dim = q_shape
    matmul, elementwise = _readout_counts(n_tokens, head_dim, _feature_map(inputs, 5),
                                          state_shape[-2], _has_rope(inputs, 3))
    return Counter(attn_matmul=prod(groups) * matmul, attn_elementwise=prod(groups) * elementwise)


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> Counter:
    """Handle for ``aten::scaled_dot_product_attention``: ``q k^T`` and ``A v`` multiply-adds."""
    q_shape, k_shape, v_shape = _shapes(inputs[:3])
    n_keys, head_dim, value_dim = k_shape[-2], q_shape[-1], v_shape[-1]
    return Counter(sdpa=prod(q_shape[:-1]) * n_keys * (head_dim + value_dim))


def build_flop_analyzer(model: nn.Module, inputs: Tuple[Any, ...],
                        attention_handles: bool = True) -> FlopAnalyzer:
    """mmengine's :class:`FlopAnalyzer` with the kernelised-attention and SDPA handles installed.

    ``attention_handles=False`` gives the stock analyzer (for comparison). Trace and
    unsupported-op warnings are silenced: element-wise ops count 0 by convention, and
    ``analyzer.unsupported_ops()`` lists what was left out.
    """
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.tracer_warnings('none').unsupported_ops_warnings(False) \
        .uncalled_modules_warnings(False)
    if attention_handles:
        analyzer.set_op_handle(KERNELIZED_OPS[0], kernelized_state_flop_jit,
                               KERNELIZED_OPS[1], kernelized_readout_flop_jit,
                               SDPA_OP, sdpa_flop_jit)
    return analyzer


@dataclass
class FlopCount:
    """What :func:`count_flops` measured (flops: 1 multiply-add = 1)."""
    total: int
    by_operator: Counter
    by_module: Counter
    uncounted: Dict[str, int]  # ops the convention leaves at 0, with their call counts
    table: str  # mmengine's per-module table (params and flops)

    @property
    def attention(self) -> int:
        """Token mixing alone: kernelised attention (matmul + element-wise) and softmax SDPA."""
        return sum(self.by_operator[k] for k in ('attn_matmul', 'attn_elementwise', 'sdpa'))


def count_flops(model: nn.Module, inputs: Tuple[Any, ...], max_depth: int = 3) -> FlopCount:
    """Flops of ``model(*inputs)`` with every token mixer counted: the one entry point."""
    analyzer = build_flop_analyzer(model, inputs)
    with torch.no_grad():
        total = analyzer.total()
    return FlopCount(total=total, by_operator=Counter(analyzer.by_operator()),
                     by_module=Counter(analyzer.by_module()),
                     uncounted=dict(analyzer.unsupported_ops()),
                     table=complexity_stats_table(analyzer, max_depth=max_depth,
                                                  show_param_shapes=False))
