"""FLOP counting for NaLaFormer models, on top of :mod:`mmengine.analysis` (JIT-trace based).

Convention (mmengine's, from fvcore): one multiply-add is one flop; linear layers, convolutions
and matmuls count their multiply-adds, norms a few flops per element, and element-wise ops
(activations, residual adds, softmax) count nothing. mmengine has no handle for two ops of this
model, so they would count 0; this module adds them:

* ``aten::scaled_dot_product_attention`` (:class:`~nala_mm.models.SoftmaxAttention`): ``q k^T``
  plus ``A v``, ``B*h*N_q*N_k*(d + d_v)`` = ``2*B*h*N^2*d``; the softmax itself counts 0, like
  everywhere else.
* The fast kernelised-attention node :class:`~nala_mm.ops.ChunkedKernelizedAttention` (NaLa and
  plain linear attention): the tracer records it as one ``prim::PythonOp`` node
  (:data:`KERNELIZED_OP`); its feature maps travel as the node's scalar arguments, so the handle
  reads the feature width ``e*d`` (``e`` = 2 for NaLa's split kernels, 1 for its positive part
  and for plain linear attention) and each map's element-wise cost.
  Per (batch, head), with N tokens and head dim d, it counts

  under ``attn_matmul`` (what the reference mode's matmuls add up to):
    * state ``S = G_k^T v``                        N*e*d*d
    * numerator ``G_q S``                          N*e*d*d
    * normaliser dot ``phi(q) . mean_j phi(k_j)``  N*e*d

  under ``attn_elementwise`` (work the stock convention would ignore; each term is output
  elements x a per-element constant):
    * key mean ``mean_j phi(k_j)``                 N*e*d  (one add per element)
    * features ``phi(q)`` and ``phi(k)``           (c_q + c_k) * N*e*d  (``c``: each map's
                                                   ``flops_per_feature``)
    * RoPE on ``phi(q)`` and ``phi(k)``            2 * ROPE_FLOPS * N*e*d  (only with RoPE)
    * scaling the output by ``z``                  N*d

  For NaLa (e = 2, c = 4) that is ``4*N*d^2 + 29*N*d`` with RoPE, the leading ``4*N*d^2`` of
  docs/method.md ('Cost').

The reference mode (``mode='reference'``, and every mixer while exporting) is made of ordinary
ops, so stock mmengine counts it: its ``matmul`` total equals the fast node's ``attn_matmul``
exactly, while its element-wise work counts 0 there, as for any other model.

:func:`count_flops` is the one entry point (``tools/get_flops.py`` and the benchmarks use it).
The counts of the model variants against the paper's: docs/fidelity.md, 'FLOPs'.
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

from ..ops import ChunkedKernelizedAttention, FeatureMap

# Per rotated output element: ``x cos - y sin`` (or ``x sin + y cos``) is two multiply-adds.
ROPE_FLOPS = 2

KERNELIZED_OP = f'prim::PythonOp.{ChunkedKernelizedAttention.__name__}'
SDPA_OP = 'aten::scaled_dot_product_attention'


def kernelized_attention_flop_counts(n_tokens: int, head_dim: int, heads: int,
                                     query_map: FeatureMap, key_map: FeatureMap,
                                     batch: int = 1, rope: bool = True) -> Counter:
    """Flops of one kernelised attention call split into ``attn_matmul`` and
    ``attn_elementwise`` (module doc)."""
    n, d, width = n_tokens, head_dim, key_map.expansion * head_dim
    matmul = n * width * d + n * width * d + n * width
    features = (query_map.flops_per_feature + key_map.flops_per_feature) * n * width
    elementwise = n * width + features + n * d
    if rope:
        elementwise += 2 * ROPE_FLOPS * n * width
    groups = batch * heads
    return Counter(attn_matmul=groups * matmul, attn_elementwise=groups * elementwise)


def _shapes(values: List[Any]) -> List[List[int]]:
    shapes = [get_shape(v) for v in values]
    if any(s is None for s in shapes):
        raise ValueError('attention flop handle: an input has no complete shape in the trace')
    return shapes


def kernelized_flop_jit(inputs: List[Any], outputs: List[Any]) -> Counter:
    """Handle for the :data:`KERNELIZED_OP` node: tensor inputs ``q, k, v`` ``(..., N, d)``
    and, with RoPE, the phasor table; the feature maps are the node's first scalar arguments."""
    q_shape, k_shape, v_shape = _shapes(inputs[:3])
    if not q_shape == k_shape == v_shape:
        raise ValueError(f'kernelised attention flop handle expects q, k, v of one shape, got '
                         f'{q_shape}, {k_shape}, {v_shape}')
    # without RoPE the phasor argument is a None scalar ahead of the maps: pick them by type
    query_map, key_map = [a for a in outputs[0].node().scalar_args()
                          if isinstance(a, FeatureMap)][:2]
    *groups, n_tokens, head_dim = q_shape
    return kernelized_attention_flop_counts(n_tokens, head_dim, prod(groups), query_map, key_map,
                                            rope=len(inputs) > 3)


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
        analyzer.set_op_handle(KERNELIZED_OP, kernelized_flop_jit, SDPA_OP, sdpa_flop_jit)
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
