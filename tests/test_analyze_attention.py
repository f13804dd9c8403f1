"""nala_mm.analysis.attention_stats on constructed inputs, and tools/analyze_attention.py end to
end."""
import json
import math
import os
import os.path as osp
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from nala_mm.analysis import (attention_layers, average_ranks, build_model_from_config,
                              capture_inputs, layer_statistics, preprocess, query_entropies,
                              query_token, row_entropy, spearman, stage_of)
from nala_mm.analysis.attention_stats import SAMPLED_QUERIES
from nala_mm.models import (GatedAttention, LinearAttention, NormAwareLinearAttention,
                            SoftmaxAttention)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = 'configs/demo/ade20k_demo_nala_upernet.py'
IMAGE_SIZE = (96, 128)  # (H, W); the demo backbone has strides 4, 8, 16, 32
integration = pytest.mark.integration  # starts processes


def run_tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, 'tools/analyze_attention.py', *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS='ignore'))


def scaled_queries(layer: GatedAttention, x: torch.Tensor, target: float,
                   reduce: str) -> torch.Tensor:
    """Scale the q-projection so that ``reduce`` ('min' or 'max') of the per-head ||q|| on ``x``
    equals ``target``; returns the new per-head norms."""
    dims = layer.embed_dims
    with torch.no_grad():
        norms = torch.linalg.vector_norm(layer.project(x)[0], dim=-1)
        factor = target / getattr(norms, reduce)().item()
        layer.qkvg.weight[:dims] *= factor  # q is the first chunk of qkvg
        layer.qkvg.bias[:dims] *= factor
        return torch.linalg.vector_norm(layer.project(x)[0], dim=-1)


# ------------------------------------------------------------------------------ statistics
def test_spearman_averages_tied_ranks():
    # x ranks 1, 2.5, 2.5, 4 (tie), y ranks 4, 3, 2, 1; centred: (-1.5, 0, 0, 1.5) and
    # (1.5, 0.5, -0.5, -1.5): r = -4.5 / sqrt(4.5 * 5) = -3 / sqrt(10)
    np.testing.assert_allclose(average_ranks(np.array([1, 2, 2, 3])), [1, 2.5, 2.5, 4])
    assert spearman([1, 2, 2, 3], [4, 3, 2, 1]) == pytest.approx(-3 / math.sqrt(10),
                                                                         abs=1e-12)
    assert spearman([3, 1, 2], [30, 10, 20]) == pytest.approx(1.0)  # monotone, not linear
    assert spearman([1, 2, 3], [5, 25, 1000]) == pytest.approx(1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_row_entropy_of_known_rows_and_refuses_signed_rows():
    n = 64
    rows = torch.stack([torch.full((n,), 1.0 / n), torch.eye(n)[3],
                        torch.cat([torch.full((2,), 0.5), torch.zeros(n - 2)])])
    np.testing.assert_allclose(row_entropy(rows).numpy(), [math.log(n), 0.0, math.log(2)],
                               atol=1e-6)
    with pytest.raises(ValueError, match='-0.1'):
        row_entropy(torch.tensor([[0.6, 0.5, -0.1]]))


def test_saturated_share_follows_the_query_norm():
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(32, 2).eval()  # lam 3, tau 0.5: saturated for ||q|| > 2.44
    x = torch.randn(1, 8, 10, 32)
    assert scaled_queries(layer, x, 3.2, 'min').min() > 3
    large = layer_statistics(layer, x)
    assert large.saturated_share == 1.0
    assert large.summary('a', 0)['exponent_ceiling'] == pytest.approx(4.5)
    assert scaled_queries(layer, x, 0.45, 'max').max() < 0.5
    small = layer_statistics(layer, x)
    assert small.saturated_share == 0.0
    assert small.qnorm.max() < 0.5 and small.qnorm.size == 2 * 80  # heads x tokens

    fixed = NormAwareLinearAttention(32, 2, norm_aware=False).eval()
    entry = layer_statistics(fixed, x).summary('fixed', 1)
    assert entry['norm_aware'] is False and entry['saturated_share'] is None
    assert entry['fixed_exponent'] == 3.0


def test_nala_entropy_falls_with_the_query_norm_linear_attention_ignores_it():
    torch.manual_seed(0)
    heads, tokens, dims = 2, 512, 16
    direction = torch.nn.functional.normalize(torch.randn(1, heads, tokens, dims), dim=-1)
    norms = torch.logspace(-1.3, 0.7, tokens)[torch.randperm(tokens)]  # 0.05 .. 5
    q = direction * norms[:, None]
    k = torch.randn(1, heads, tokens, dims)
    pooled_norms = norms.expand(heads, tokens).flatten().numpy()

    nala = NormAwareLinearAttention(heads * dims, heads).eval()
    nala_entropy = query_entropies(nala, q, k, None, chunk=100)
    assert nala_entropy.shape == (1, heads, tokens)
    assert spearman(nala_entropy.flatten().numpy(), pooled_norms) < -0.5

    linear = LinearAttention(heads * dims, heads).eval()
    entropy = query_entropies(linear, q, k, None)
    torch.testing.assert_close(query_entropies(linear, q * 7.0, k, None), entropy,
                               rtol=0, atol=1e-4)
    torch.testing.assert_close(query_entropies(linear, q * 0.1, k, None), entropy,
                               rtol=0, atol=1e-4)
    assert abs(spearman(entropy.flatten().numpy(), pooled_norms)) < 0.2


def test_entropy_rows_drop_rope_only_for_kernelised_mixers():
    torch.manual_seed(0)
    x = torch.randn(1, 6, 8, 32)
    for layer, label in ((NormAwareLinearAttention(32, 2), 'without RoPE'),
                         (LinearAttention(32, 2), 'without RoPE'),
                         (SoftmaxAttention(32, 2), 'with RoPE')):
        stats = layer_statistics(layer.eval(), x)
        assert stats.entropy_rows == label
        # every row is a distribution over 48 tokens: 0 <= entropy <= log 48
        assert stats.entropy.min() >= 0 and stats.entropy.max() <= math.log(48) + 1e-5


def test_query_points_map_to_the_token_grid_and_rows_are_single():
    assert query_token((0, 0), IMAGE_SIZE, (24, 32)) == (0, 0)
    assert query_token((64, 48), IMAGE_SIZE, (24, 32)) == (12, 16)
    assert query_token((127.9, 95.9), IMAGE_SIZE, (3, 4)) == (2, 3)
    assert query_token((31, 33), IMAGE_SIZE, (3, 4)) == (1, 0)  # floor(33*3/96)=1

    torch.manual_seed(0)
    layer = SoftmaxAttention(32, 4).eval()
    stats = layer_statistics(layer, torch.randn(1, 6, 8, 32), [(100, 10), (5, 90)],
                                  IMAGE_SIZE)
    assert stats.query_tokens == [(0, 6), (5, 0)]
    for token_map in stats.maps:
        assert token_map.shape == (6, 8)
        assert token_map.sum() == pytest.approx(1.0, abs=1e-5)  # mean of softmax rows


def test_large_layers_sample_a_fixed_set_of_queries():
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(16, 1).eval()
    x = torch.randn(1, 96, 96, 16)  # 9216 tokens > MAX_FULL_TOKENS
    first = layer_statistics(layer, x, chunk=1024)
    entry = first.summary('big', 0)
    assert entry['tokens'] == 9216 and entry['entropy_queries'] == SAMPLED_QUERIES
    assert entry['entropy_queries_sampled'] is True
    assert first.qnorm.size == 9216  # norms of every query, entropies of the sample
    np.testing.assert_array_equal(layer_statistics(layer, x, chunk=1024).entropy_qnorm,
                                  first.entropy_qnorm)


@integration
def test_tool_names_missing_inputs(tmp_path):
    image = tmp_path / 'image.png'
    Image.new('RGB', (16, 16)).save(image)
    missing = str(tmp_path / 'no_such_checkpoint.pth')
    proc = run_tool(DEMO, missing, str(image), '--out-dir', str(tmp_path / 'out'))
    assert proc.returncode != 0
    assert re.search(r'FileNotFoundError: checkpoint .*no_such_checkpoint.pth', proc.stderr)
    proc = run_tool(DEMO, str(image), str(tmp_path / 'no_such_image.png'),
                    '--out-dir', str(tmp_path / 'out'))
    assert proc.returncode != 0
    assert re.search(r'FileNotFoundError: image .*no_such_image.png', proc.stderr)
    assert not (tmp_path / 'out').exists()


# ------------------------------------------------------------------------------ end to end
@pytest.fixture(scope='module')
def demo_model_checkpoint(tmp_path_factory):
    """The demo segmentor, randomly initialised, and its checkpoint (no training needed)."""
    torch.manual_seed(0)
    model, _ = build_model_from_config(DEMO)
    path = tmp_path_factory.mktemp('ckpt') / 'demo.pth'
    torch.save({'state_dict': model.state_dict()}, path)
    return model, str(path)


def test_layers_of_the_demo_backbone_and_their_inputs(demo_model_checkpoint):
    model, _ = demo_model_checkpoint
    image = np.random.default_rng(0).integers(0, 256, (*IMAGE_SIZE, 3), dtype=np.uint8)
    inputs = preprocess(model, image)
    assert tuple(inputs.shape) == (1, 3, *IMAGE_SIZE)
    layers = attention_layers(model.backbone)
    assert [stage_of(name) for name in layers] == [0, 1, 2, 2, 3]
    assert stage_of('attn') is None
    captured = capture_inputs(model.backbone, layers, inputs)
    for (name, layer), stride in zip(layers.items(), (4, 8, 16, 16, 32)):
        assert tuple(captured[name].shape) == (1, IMAGE_SIZE[0] // stride,
                                               IMAGE_SIZE[1] // stride, layer.embed_dims), name
    with pytest.raises(ValueError, match='no GatedAttention'):
        attention_layers(torch.nn.Conv2d(3, 3, 1))


@integration
def test_tool_end_to_end_on_the_demo_model(demo_model_checkpoint, tmp_path):
    model, checkpoint = demo_model_checkpoint
    expected = {name: type(m).__name__ for name, m in model.backbone.named_modules()
                if isinstance(m, GatedAttention)}
    assert len(expected) == 5  # 2 NaLa stages of depth 1, softmax stages of depth 2 and 1
    height, width = IMAGE_SIZE
    rows, cols = np.mgrid[0:height, 0:width]
    pattern = np.stack([rows * 2 % 256, cols * 2 % 256, (rows + cols) * 3 % 256], axis=-1)
    image = tmp_path / 'pattern.png'
    Image.fromarray(pattern.astype(np.uint8)).save(image)
    out_dir = tmp_path / 'out'

    proc = run_tool(DEMO, checkpoint, str(image), '--out-dir', str(out_dir),
                    '--points', '64,48', '10,90')
    assert proc.returncode == 0, proc.stderr[-3000:]

    stats = json.loads((out_dir / 'attention_stats.json').read_text())
    assert stats['input_size'] == [96, 128] and stats['image_size'] == [96, 128]
    layers = stats['layers']
    assert {e['layer']: e['mixer'] for e in layers} == expected
    assert [e['stage'] for e in layers] == [0, 1, 2, 2, 3]
    assert [e['tokens'] for e in layers] == [24 * 32, 12 * 16, 6 * 8, 6 * 8, 3 * 4]
    assert [e['heads'] for e in layers] == [1, 2, 4, 4, 6]
    for entry in layers:
        rho = entry['spearman_entropy_vs_qnorm']
        assert rho is not None and -1.0 <= rho <= 1.0, entry
        assert len(entry['spearman_per_head']) == entry['heads']
        assert all(-1.0 <= r <= 1.0 for r in entry['spearman_per_head']), entry
        assert entry['entropy_queries'] == entry['tokens']
        assert entry['entropy_queries_sampled'] is False
        assert 0 < entry['qnorm_p5'] <= entry['qnorm_mean'] <= entry['qnorm_p95']
        # (64, 48) and (10, 90) on a 96 x 128 image, floor(y h / 96), floor(x w / 128)
        h, w = entry['grid']
        assert entry['query_tokens'] == [[h // 2, w // 2], [90 * h // 96, 10 * w // 128]]
        if entry['mixer'] == 'NormAwareLinearAttention':
            assert entry['entropy_rows'] == 'without RoPE' and entry['norm_aware'] is True
            assert 0.0 <= entry['saturated_share'] <= 1.0
        else:
            assert entry['entropy_rows'] == 'with RoPE' and 'saturated_share' not in entry
        assert (out_dir / entry['figure']).stat().st_size > 10_000
    assert (out_dir / 'summary.png').stat().st_size > 10_000
    assert 'layers.0.blocks.0.attn' in proc.stdout and 'NormAwareLinearAttention' in proc.stdout
