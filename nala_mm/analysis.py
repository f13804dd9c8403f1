"""FLOP counting for NaLaFormer models, on top of :mod:`mmengine.analysis` (JIT-trace based).

Convention (mmengine's, from fvcore): one multiply-add is one flop; linear layers, convolutions
and matmuls count their multiply-adds, norms a few flops per element, and element-wise ops
(activations, residual adds, softmax) count nothing. mmengine has no handle for two ops of this
model, so they would count 0; this module adds them:

* ``aten::scaled_dot_product_attention`` (:class:`SoftmaxAttention`): ``q k^T`` plus ``A v``,
  ``B*h*N_q*N_k*(d + d_v)`` = ``2*B*h*N^2*d``; the softmax itself counts 0, like everywhere else.
* NaLa's fast path, the autograd function ``_NaLaFunction``: the tracer records it as one
  ``prim::PythonOp`` node, which :class:`mmengine.analysis.FlopAnalyzer` keys as
  ``'prim::PythonOp._NaLaFunction'`` (the node kind plus its Python name). Per (batch, head), with
  N tokens, head dim d and 2d-wide features, it counts

  under ``nala_matmul`` (what the plain reference implementation's matmuls add up to):
    * state ``S = G_k^T v``                        N*2d*d
    * numerator ``G_q S``                          N*2d*d
    * normaliser dot ``phi(q) . mean_j phi(k_j)``  N*2d

  under ``nala_elementwise`` (work the stock convention would ignore, but 10-20 % of the NaLa
  core at d = 32-64; each term is output elements x a per-element constant):
    * key mean ``mean_j phi(k_j)``                 N*2d  (one add per element)
    * features ``phi(q)`` and ``phi(k)``           2 * FEATURE_FLOPS * N*2d
    * RoPE on ``phi(q)`` and ``phi(k)``            2 * ROPE_FLOPS * N*2d  (only with RoPE)
    * scaling the output by ``z``                  N*d

  i.e. ``4*N*d^2 + (2 + 2 + 4*FEATURE_FLOPS + 4*ROPE_FLOPS + 1)*N*d`` = ``4*N*d^2 + 29*N*d`` with
  RoPE, the spec's ``~ 4*N*d^2`` plus an O(N*d) term.

The plain implementation (``implementation='reference'``) is made of ordinary ops, so stock
mmengine counts it: its ``matmul`` total equals the fast path's ``nala_matmul`` exactly, while its
element-wise work (features, RoPE) counts 0 there, as for any other model.

:func:`build_model_from_config` builds a config's model (mmseg or mmdet) for the analysis and
benchmark tools.
"""
import importlib
import os.path as osp
from collections import Counter
from math import prod
from typing import Any, List, Optional, Tuple

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import get_shape
from mmengine.analysis.print_helper import complexity_stats_table
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.utils import get_installed_path
from torch import nn

from .ops.nala_fast import _NaLaFunction
from .runtime import load_config

# Per output element of a 2d-wide feature map: the cosine kernel's per-component work (norm,
# divide, power, angle, cos and sin, two products; an elementary function counts as one flop)
# is about 8 flops per component, shared by its two outputs. The relu kernel does less; it is
# counted the same so that the number depends on shapes only.
FEATURE_FLOPS = 4
# Per rotated output element: ``x cos - y sin`` (or ``x sin + y cos``) is two multiply-adds.
ROPE_FLOPS = 2

NALA_OP = f'prim::PythonOp.{_NaLaFunction.__name__}'
SDPA_OP = 'aten::scaled_dot_product_attention'


def nala_attention_flop_counts(n_tokens: int, head_dim: int, heads: int, batch: int = 1,
                               rope: bool = True) -> Counter:
    """Flops of NaLa attention split into ``nala_matmul`` and ``nala_elementwise`` (module doc)."""
    n, d, width = n_tokens, head_dim, 2 * head_dim
    matmul = n * width * d + n * width * d + n * width
    elementwise = n * width + 2 * FEATURE_FLOPS * n * width + n * d
    if rope:
        elementwise += 2 * ROPE_FLOPS * n * width
    groups = batch * heads
    return Counter(nala_matmul=groups * matmul, nala_elementwise=groups * elementwise)


def nala_attention_flops(n_tokens: int, head_dim: int, heads: int, batch: int = 1,
                         rope: bool = True) -> int:
    """Total flops the handle assigns to one NaLa attention call: ``~ 4*N*d^2*heads*batch``."""
    return sum(nala_attention_flop_counts(n_tokens, head_dim, heads, batch, rope).values())


def _shapes(values: List[Any]) -> List[List[int]]:
    shapes = [get_shape(v) for v in values]
    if any(s is None for s in shapes):
        raise ValueError('attention flop handle: an input has no complete shape in the trace')
    return shapes


def nala_flop_jit(inputs: List[Any], outputs: List[Any]) -> Counter:
    """Handle for the ``_NaLaFunction`` node: inputs are ``q, k, v`` ``(..., N, d)`` and, with
    RoPE, the phasor table (``None`` arguments are not tensor inputs of the node)."""
    q_shape, k_shape, v_shape = _shapes(inputs[:3])
    if not q_shape == k_shape == v_shape:
        raise ValueError(f'NaLa flop handle expects q, k, v of one shape, got {q_shape}, '
                         f'{k_shape}, {v_shape}')
    *groups, n_tokens, head_dim = q_shape
    return nala_attention_flop_counts(n_tokens, head_dim, heads=prod(groups),
                                      rope=len(inputs) > 3)


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> Counter:
    """Handle for ``aten::scaled_dot_product_attention``: ``q k^T`` and ``A v`` multiply-adds."""
    q_shape, k_shape, v_shape = _shapes(inputs[:3])
    n_keys, head_dim, value_dim = k_shape[-2], q_shape[-1], v_shape[-1]
    return Counter(sdpa=prod(q_shape[:-1]) * n_keys * (head_dim + value_dim))


def build_flop_analyzer(model: nn.Module, inputs: Tuple[Any, ...],
                        nala_handles: bool = True) -> FlopAnalyzer:
    """mmengine's :class:`FlopAnalyzer` with the NaLa and SDPA handles installed.

    ``nala_handles=False`` gives the stock analyzer (for comparison). Trace and
    unsupported-op warnings are silenced: element-wise ops count 0 by convention, and
    ``analyzer.unsupported_ops()`` lists what was left out.
    """
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.tracer_warnings('none').unsupported_ops_warnings(False) \
        .uncalled_modules_warnings(False)
    if nala_handles:
        analyzer.set_op_handle(NALA_OP, nala_flop_jit, SDPA_OP, sdpa_flop_jit)
    return analyzer


def count_flops(model: nn.Module, inputs: Tuple[Any, ...], max_depth: int = 3) -> Tuple[int, str]:
    """Total flops of ``model(*inputs)`` and mmengine's per-module table (params and flops)."""
    analyzer = build_flop_analyzer(model, inputs)
    with torch.no_grad():
        total = analyzer.total()
    return total, complexity_stats_table(analyzer, max_depth=max_depth, show_param_shapes=False)


def resolve_config_path(path: str) -> str:
    """``'mmseg::swin/x.py'`` -> the file inside the installed package; other paths unchanged."""
    if '::' not in path:
        return path
    package, relative = path.split('::', 1)
    return osp.join(get_installed_path(package), '.mim', 'configs', relative)


def build_model_from_config(path: str, cfg_options: Optional[dict] = None) -> Tuple[nn.Module, str]:
    """Build a config's model with its scope's registry, SyncBN reverted to BN, in eval mode.

    Returns the model and the config's default scope (``'mmseg'`` or ``'mmdet'``). Weights are
    not initialised from any checkpoint (nothing is downloaded).
    """
    cfg = load_config(resolve_config_path(path), cfg_options=cfg_options)
    scope = cfg.get('default_scope', 'mmseg')
    init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    # SyncBN needs a process group; a single-process measurement runs it as BN.
    return revert_sync_batchnorm(registry.build(cfg.model)).eval(), scope
