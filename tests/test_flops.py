"""FLOP counting: the NaLa and SDPA handles against analytic counts, and tools/get_flops.py."""
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch

from nala_mm.analysis import NALA_OP, build_flop_analyzer, nala_attention_flops
from nala_mm.models.attention import NormAwareLinearAttention, SoftmaxAttention

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CHANNELS, HEADS, SIDE = 64, 2, 14
TOKENS, HEAD_DIM = SIDE * SIDE, CHANNELS // HEADS


def layer_input() -> torch.Tensor:
    return torch.randn(1, CHANNELS, SIDE, SIDE)


def analyze(module, nala_handles: bool = True):
    analyzer = build_flop_analyzer(module.eval(), (layer_input(),), nala_handles=nala_handles)
    with torch.no_grad():
        analyzer.total()
    return analyzer


def projections_flops() -> int:
    """Everything around the token mixing, from the layer's definition (one multiply-add each)."""
    n, c = TOKENS, CHANNELS
    qkvg = n * c * 4 * c
    lepe = n * c * 5 * 5  # depthwise: one 5x5 filter per channel
    layer_norm = 5 * n * c  # mmengine: mean, var, normalise, scale, shift
    out_proj = n * c * c
    return qkvg + lepe + layer_norm + out_proj


def test_nala_layer_total_matches_analytic_count():
    n, d = TOKENS, HEAD_DIM
    per_head = (2 * n * d * d        # state: (2d x N) @ (N x d)
                + 2 * n * d * d      # numerator: (N x 2d) @ (2d x d)
                + 2 * n * d          # normaliser: (N x 2d) @ (2d x 1)
                + 2 * n * d          # key mean over N rows of 2d
                + 2 * 4 * 2 * n * d  # phi(q), phi(k): 4 flops per feature element
                + 2 * 2 * 2 * n * d  # RoPE on both: 2 multiply-adds per element
                + n * d)             # output times z
    expected = projections_flops() + HEADS * per_head
    total = analyze(NormAwareLinearAttention(CHANNELS, HEADS)).total()
    assert abs(total - expected) / expected < 0.05
    # the spec's leading term dominates: 4 N d^2 per head
    assert 4 * n * d * d * HEADS / (total - projections_flops()) > 0.8


@pytest.mark.parametrize('use_rope', [True, False])
def test_nala_handle_is_invoked(use_rope):
    layer = NormAwareLinearAttention(CHANNELS, HEADS, use_rope=use_rope)
    stock, ours = analyze(layer, nala_handles=False), analyze(layer)
    assert stock.unsupported_ops()[NALA_OP] == 1  # stock mmengine counts the PythonOp as 0
    assert NALA_OP not in ours.unsupported_ops()
    assert ours.total() - stock.total() == nala_attention_flops(TOKENS, HEAD_DIM, HEADS,
                                                                rope=use_rope)


@pytest.mark.parametrize('use_rope', [True, False])
def test_fast_and_reference_matmul_counts_agree(use_rope):
    fast = NormAwareLinearAttention(CHANNELS, HEADS, use_rope=use_rope)
    reference = NormAwareLinearAttention(CHANNELS, HEADS, use_rope=use_rope,
                                         implementation='reference')
    fast_ops = analyze(fast).by_operator()
    reference_ops = analyze(reference, nala_handles=False).by_operator()  # stock handles only
    n, d = TOKENS, HEAD_DIM
    assert reference_ops['matmul'] == HEADS * (4 * n * d * d + 2 * n * d)
    assert fast_ops['nala_matmul'] == reference_ops['matmul']
    for op in ('linear', 'conv', 'layer_norm'):
        assert fast_ops[op] == reference_ops[op], op


def test_sdpa_handle_matches_analytic_count():
    n, d = TOKENS, HEAD_DIM
    attention = 2 * n * n * d * HEADS  # q k^T and A v
    analyzer = analyze(SoftmaxAttention(CHANNELS, HEADS))
    assert analyzer.by_operator()['sdpa'] == attention
    expected = projections_flops() + attention
    assert abs(analyzer.total() - expected) / expected < 0.05


def test_get_flops_tool_on_a_segmentor():
    proc = subprocess.run(
        [sys.executable, osp.join('tools', 'get_flops.py'), 'configs/ade20k_nala_upernet.py',
         '--shape', '128', '128', '--max-depth', '1'],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS='ignore'))
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = re.search(r'^params: ([\d.]+) M$', proc.stdout, re.M)
    gflops = re.search(r'^GFLOPs: ([\d.]+)', proc.stdout, re.M)
    nala = re.search(r'NaLa attention: ([\d.]+)', proc.stdout)
    assert params and gflops and nala, proc.stdout[-3000:]
    assert 20 < float(params.group(1)) < 100  # NaLaFormer-T (14M) + UperNet head
    assert float(gflops.group(1)) > 1 and float(nala.group(1)) > 0
    assert '| module' in proc.stdout  # mmengine's complexity table
