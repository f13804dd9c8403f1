"""nala_mm.analysis.attention_stats on constructed inputs, and tools/analyze_attention.py end to
end."""
import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from nala_mm.analysis import (
    analyze_backbone,
    attention_layers,
    attention_stats,
    average_ranks,
    capture_inputs,
    layer_statistics,
    preprocess,
    query_entropies,
    query_token,
    row_entropy,
    saturated_share,
    saturation_norm,
    spearman,
)
from nala_mm.apis.config_loading import build_model_from_config
from nala_mm.models import (
    GatedAttention,
    LinearAttention,
    NormAwareLinearAttention,
    SoftmaxAttention,
)
from tests.helpers import REPO, tool_env
from tests.reference import formulas

DEMO = 'configs/demo/ade20k_demo_nala_upernet.py'
IMAGE_SIZE = (96, 128)  # (H, W); the demo backbone has strides 4, 8, 16, 32
integration = pytest.mark.integration  # starts processes


def run_tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, 'tools/analyze_attention.py', *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=tool_env())


def independent_rows(layer: GatedAttention, x: torch.Tensor):
    """A layer's attention rows (heads, N, N) and query norms (heads, N) on its input x
    (1, h, w, C), in float64 from the layer's weights and tests/reference/formulas.py: NaLa and
    linear attention without RoPE (a kernelised row with RoPE is no distribution), softmax with
    it, scaled by d^-1/2."""
    _, height, width, channels = x.shape
    heads, d = layer.num_heads, channels // layer.num_heads
    tokens = x.double().reshape(-1, channels)  # row-major (h, w)
    weight, bias = layer.qkvg.weight.detach().double(), layer.qkvg.bias.detach().double()

    def head_split(i):  # qkvg's rows: q, k, v, gate
        out = tokens @ weight[i * channels:(i + 1) * channels].T + bias[i * channels:
                                                                         (i + 1) * channels]
        return out.reshape(-1, heads, d).transpose(0, 1)  # (heads, N, d)

    q, k = head_split(0), head_split(1)
    if isinstance(layer, SoftmaxAttention):
        cos, sin = formulas.rope_tables(height, width, d)
        scores = formulas.rotate(q, cos, sin) @ formulas.rotate(k, cos, sin).transpose(-1, -2)
        return torch.softmax(scores * d ** -0.5, dim=-1), q.norm(dim=-1)
    if isinstance(layer, NormAwareLinearAttention):
        cfg = layer.cfg
        phi_q = formulas.nala_query_features(q, cfg.kernel, cfg.alpha, cfg.lam, cfg.tau)
        phi_k = formulas.nala_key_features(k, cfg.kernel, cfg.alpha)
    else:
        phi_q, phi_k = formulas.linear_features(q, 'relu'), formulas.linear_features(k, 'relu')
    scores = phi_q @ phi_k.transpose(-1, -2)
    return scores / scores.sum(-1, keepdim=True), q.norm(dim=-1)


def entropy_of(rows: torch.Tensor) -> torch.Tensor:
    return -(rows * torch.where(rows > 0, rows.log(), torch.zeros_like(rows))).sum(-1)


def scipy_spearman(x, y) -> float:
    from scipy.stats import spearmanr
    return float(spearmanr(np.ravel(x), np.ravel(y)).statistic)


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
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 9, 200), rng.normal(size=200)  # many ties in x
    assert spearman(x, y) == pytest.approx(scipy_spearman(x, y), abs=1e-12)


def test_row_entropy_of_known_rows_and_refuses_signed_rows():
    n = 64
    rows = torch.stack([torch.full((n,), 1.0 / n), torch.eye(n)[3],
                        torch.cat([torch.full((2,), 0.5), torch.zeros(n - 2)])])
    np.testing.assert_allclose(row_entropy(rows).numpy(), [math.log(n), 0.0, math.log(2)],
                               atol=1e-6)
    with pytest.raises(ValueError, match='-0.1'):
        row_entropy(torch.tensor([[0.6, 0.5, -0.1]]))


def test_saturated_share_counts_queries_past_the_saturation_norm():
    """q is made the layer input itself (identity q projection), each head's slice of each token
    a unit direction times a chosen norm: 40 of the 160 (head, token) queries just above
    atanh(0.99 * 1.5 - 0.5) = 2.4427 (exponent >= 99 % of lam (tau + 1) = 4.5), the rest just
    below: a share of exactly 1/4."""
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(32, 2).eval()
    with torch.no_grad():
        layer.qkvg.weight[:32] = torch.eye(32)
        layer.qkvg.bias[:32] = 0
    norms = torch.full((80, 2), 2.43)
    norms.view(-1)[torch.randperm(160)[:40]] = 2.45
    directions = torch.nn.functional.normalize(torch.randn(80, 2, 16), dim=-1)
    x = (directions * norms[..., None]).reshape(1, 8, 10, 32)
    stats = layer_statistics(layer, x)
    np.testing.assert_allclose(np.sort(stats.qnorm), np.sort(norms.flatten().numpy()), rtol=1e-6)
    assert stats.saturated_share == 0.25
    entry = stats.summary('a')
    assert entry['saturated_share'] == 0.25 and entry['exponent_ceiling'] == 4.5
    assert stats.saturation_norm == pytest.approx(math.atanh(0.985), abs=1e-12)
    assert 2.43 < stats.saturation_norm < 2.45
    with torch.no_grad():  # all below, all above
        assert layer_statistics(layer, x * 2.43 / 2.45).saturated_share == 0.0
        assert layer_statistics(layer, x * 2.45 / 2.43).saturated_share == 1.0

    fixed = NormAwareLinearAttention(32, 2, norm_aware=False).eval()
    entry = layer_statistics(fixed, x).summary('fixed')
    assert entry['norm_aware'] is False and entry['saturated_share'] is None
    assert entry['fixed_exponent'] == 3.0


@pytest.mark.parametrize('query_norm, scale', [('raw', 1.0), ('rms', 4.0)])
def test_saturation_follows_the_layers_own_exponent_in_both_query_norm_modes(query_norm, scale):
    """Head dim 16: with ``query_norm='rms'`` tanh reads ||q|| / 4, so the exponent saturates
    from 4 atanh(0.985) = 9.77 instead of 2.44. Queries at 2.45 are saturated for the paper's
    exponent and for none of the rms layer's (an analysis that re-derived the exponent from
    ||q|| alone would call them all saturated); queries 4x longer are saturated for both."""
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(32, 2, query_norm=query_norm).eval()
    with torch.no_grad():
        layer.qkvg.weight[:32] = torch.eye(32)
        layer.qkvg.bias[:32] = 0
    directions = torch.nn.functional.normalize(torch.randn(80, 2, 16), dim=-1)

    def stats_at(norms: torch.Tensor):
        x = (directions * norms[..., None]).reshape(1, 8, 10, 32)
        return layer_statistics(layer, x)

    assert stats_at(torch.full((80, 2), 2.45)).saturated_share == (1.0 if scale == 1 else 0.0)
    assert stats_at(torch.full((80, 2), 2.45 * scale)).saturated_share == 1.0
    mixed = torch.full((80, 2), 2.43 * scale)
    mixed.view(-1)[torch.randperm(160)[:40]] = 2.45 * scale
    stats = stats_at(mixed)
    assert stats.saturated_share == 0.25
    # the exponent written out: lam (tau + tanh(||q|| / s)), s = 1 (raw) or sqrt(16) (rms)
    own = 3 * (0.5 + np.tanh(stats.qnorm.astype(np.float64) / scale))
    assert stats.saturated_share == float(np.mean(own >= 0.99 * 4.5))
    assert saturated_share(layer, torch.from_numpy(stats.qnorm)) == 0.25
    assert saturation_norm(layer) == pytest.approx(scale * math.atanh(0.985), abs=1e-12)
    assert stats.summary('x')['exponent_mean_over_ceiling'] == pytest.approx(
        float(own.mean()) / 4.5, rel=1e-6)


def test_nala_entropy_falls_with_the_query_norm_linear_attention_ignores_it():
    """One direction per head at 64 growing norms: NaLa's row entropy falls strictly (Spearman
    exactly -1 per head); plain linear attention on a grid of 6 directions x 8 norms gives each
    direction one entropy whatever its norm, so the grid's correlation is exactly 0."""
    torch.manual_seed(0)
    heads, dims = 2, 16
    norms = torch.linspace(0.05, 3.0, 64)
    direction = torch.nn.functional.normalize(torch.randn(heads, 1, dims), dim=-1)
    q, k = (direction * norms[:, None])[None], torch.randn(1, heads, 64, dims)
    nala = NormAwareLinearAttention(heads * dims, heads).eval()
    entropy = query_entropies(nala, q, k, None, chunk=10)[0]
    assert entropy.shape == (heads, 64)
    for head in entropy:
        assert spearman(head.numpy(), norms.numpy()) == -1.0
    pooled_norms = norms.expand(heads, -1).numpy()
    assert spearman(entropy.numpy(), pooled_norms) == pytest.approx(
        scipy_spearman(entropy.numpy(), pooled_norms), abs=1e-12)

    directions = torch.nn.functional.normalize(torch.randn(heads, 6, 1, dims), dim=-1)
    grid_norms = 2.0 ** torch.arange(-3.0, 5.0)  # 0.125 .. 16
    q = (directions * grid_norms[:, None]).reshape(1, heads, 48, dims)
    entropy = query_entropies(LinearAttention(heads * dims, heads).eval(), q,
                              torch.randn(1, heads, 48, dims), None)[0].reshape(heads, 6, 8)
    per_direction = entropy.mean(-1, keepdim=True)
    assert (entropy - per_direction).abs().max() <= 1e-6  # the norm cancels
    assert per_direction.flatten().unique().numel() == heads * 6  # the direction does not
    tied = per_direction.expand(-1, -1, 8).numpy()  # the rounding noise taken out
    assert spearman(tied, grid_norms.expand(heads, 6, -1).numpy()) == pytest.approx(0, abs=1e-12)


def test_entropy_rows_drop_rope_only_for_kernelised_mixers():
    """The entropies are those of the independently computed rows: without RoPE for NaLa and
    linear attention, with it for softmax."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, 8, 32)
    for layer, label in ((NormAwareLinearAttention(32, 2), 'without RoPE'),
                         (NormAwareLinearAttention(32, 2, kernel='relu'), 'without RoPE'),
                         (LinearAttention(32, 2), 'without RoPE'),
                         (SoftmaxAttention(32, 2), 'with RoPE')):
        stats = layer_statistics(layer.eval(), x)
        assert stats.entropy_rows == label
        rows, qnorm = independent_rows(layer, x)
        np.testing.assert_allclose(stats.entropy, entropy_of(rows).flatten().numpy(),
                                   rtol=0, atol=1e-5)
        np.testing.assert_allclose(stats.entropy_qnorm, qnorm.flatten().numpy(), rtol=1e-5)


def test_query_points_map_to_the_token_grid_and_rows_are_single():
    assert query_token((0, 0), IMAGE_SIZE, (24, 32)) == (0, 0)
    assert query_token((64, 48), IMAGE_SIZE, (24, 32)) == (12, 16)
    assert query_token((127.9, 95.9), IMAGE_SIZE, (3, 4)) == (2, 3)
    assert query_token((31, 33), IMAGE_SIZE, (3, 4)) == (1, 0)  # floor(33*3/96)=1

    torch.manual_seed(0)
    layer = SoftmaxAttention(32, 4).eval()
    x = torch.randn(1, 6, 8, 32)
    stats = layer_statistics(layer, x, [(100, 10), (5, 90)], IMAGE_SIZE)
    assert stats.query_tokens == [(0, 6), (5, 0)]
    rows, _ = independent_rows(layer, x)
    for token_map, (row, col) in zip(stats.maps, stats.query_tokens):
        # the query token's softmax row (with RoPE), mean over heads, on the token grid
        expected = rows[:, row * 8 + col].mean(0).reshape(6, 8).numpy()
        np.testing.assert_allclose(token_map, expected, rtol=0, atol=1e-6)


def test_large_layers_sample_a_fixed_set_of_queries(monkeypatch):
    """Above MAX_FULL_TOKENS the entropies are those of a fixed sample of SAMPLED_QUERIES
    queries (shrunk here): the full statistics' values at those queries, every query's norm
    kept, the same sample every time."""
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(16, 1).eval()
    x = torch.randn(1, 12, 12, 16)
    full = layer_statistics(layer, x)
    monkeypatch.setattr(attention_stats, 'MAX_FULL_TOKENS', 100)
    monkeypatch.setattr(attention_stats, 'SAMPLED_QUERIES', 32)
    sampled = layer_statistics(layer, x, chunk=10)
    entry = sampled.summary('big')
    assert entry['tokens'] == 144 and entry['entropy_queries'] == 32
    assert entry['entropy_queries_sampled'] is True
    np.testing.assert_array_equal(sampled.qnorm, full.qnorm)  # norms of every query
    rows = [int(np.flatnonzero(full.qnorm == norm)[0]) for norm in sampled.entropy_qnorm]
    assert rows == sorted(set(rows)) and len(rows) == 32
    np.testing.assert_allclose(sampled.entropy, full.entropy[rows], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(layer_statistics(layer, x, chunk=10).entropy_qnorm,
                                  sampled.entropy_qnorm)


@pytest.mark.extended
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
    assert [model.backbone.stage_of(name) for name in layers] == [0, 1, 2, 2, 3]
    assert model.backbone.stage_of('patch_embed') is None
    assert [s.stage for s in analyze_backbone(model.backbone, inputs).values()] == [0, 1, 2, 2, 3]
    captured = capture_inputs(model.backbone, layers, inputs)
    for (name, layer), stride in zip(layers.items(), (4, 8, 16, 16, 32)):
        assert tuple(captured[name].x.shape) == (1, IMAGE_SIZE[0] // stride,
                                               IMAGE_SIZE[1] // stride, layer.embed_dims), name
    with pytest.raises(ValueError, match='no token mixer'):
        attention_layers(torch.nn.Conv2d(3, 3, 1))


@pytest.mark.extended
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

    # the same layers' inputs here (the image as the tool reads it: BGR), their statistics
    # recomputed from the weights (independent_rows), Spearman by scipy
    inputs = preprocess(model, pattern[..., ::-1].astype(np.uint8))
    modules = attention_layers(model.backbone)
    captured = capture_inputs(model.backbone, modules, inputs)
    sizes = {}
    for entry in layers:
        layer = modules[entry['layer']]
        with torch.no_grad():
            rows, qnorm = independent_rows(layer, captured[entry["layer"]].x)
        entropy, qnorm = entropy_of(rows).numpy(), qnorm.numpy()
        # ranks: float32 noise between the tool's path and this recomputation reorders
        # near-tied entropies, which moves Spearman by about 1e-4
        assert entry['spearman_entropy_vs_qnorm'] == pytest.approx(
            scipy_spearman(entropy, qnorm), abs=1e-3), entry
        assert entry['spearman_per_head'] == pytest.approx(
            [scipy_spearman(e, n) for e, n in zip(entropy, qnorm)], abs=1e-3), entry
        assert entry['entropy_mean'] == pytest.approx(entropy.mean(), abs=1e-5)
        assert entry['qnorm_mean'] == pytest.approx(qnorm.mean(), rel=1e-5)
        assert [entry['qnorm_p5'], entry['qnorm_p95']] == pytest.approx(
            np.percentile(qnorm, [5, 95]), rel=1e-5)
        assert entry['entropy_queries'] == entry['tokens']
        assert entry['entropy_queries_sampled'] is False
        # (64, 48) and (10, 90) on a 96 x 128 image, floor(y h / 96), floor(x w / 128)
        h, w = entry['grid']
        assert entry['query_tokens'] == [[h // 2, w // 2], [90 * h // 96, 10 * w // 128]]
        if entry['mixer'] == 'NormAwareLinearAttention':
            assert entry['entropy_rows'] == 'without RoPE' and entry['norm_aware'] is True
            exponent = 3 * (0.5 + np.tanh(qnorm))  # lam (tau + tanh ||q||)
            assert entry['saturated_share'] == pytest.approx(
                np.mean(exponent >= 0.99 * 4.5), abs=1e-12)
            panels = 4  # scatter, norm histogram, two query maps
        else:
            assert entry['entropy_rows'] == 'with RoPE' and 'saturated_share' not in entry
            panels = 3
        sizes[entry['figure']] = (450 * panels, 420)  # 4.5 x 4.2 inches a panel at 100 dpi
    sizes['summary.png'] = (600, 420)  # 0.8 inch a layer + 2, at least 5; 4.2 high

    pictures = {}
    for name, size in sizes.items():
        with Image.open(out_dir / name) as picture:
            assert picture.size == size, name
            pictures[name] = np.asarray(picture.convert('RGB'))
        assert len(np.unique(pictures[name].reshape(-1, 3), axis=0)) > 100, name  # not blank
    for name, pixels in pictures.items():
        if name != 'summary.png':  # the two query maps, the last two panels, differ
            assert not np.array_equal(pixels[:, -900:-450], pixels[:, -450:]), name
    figures = [p for n, p in pictures.items() if n != 'summary.png' and p.shape[1] == 1800]
    assert len(figures) == 2 and not np.array_equal(*figures)  # two NaLa layers, two pictures
    assert 'layers.0.blocks.0.attn' in proc.stdout and 'NormAwareLinearAttention' in proc.stdout


@pytest.mark.extended
@integration
def test_tool_on_a_nala_vit_with_its_class_token(tmp_path):
    """The long-range task's one-layer ViT with NaLa swapped in (a random checkpoint): the
    layer's statistics count the class token as the one prefix token beside the 16 x 16 grid,
    and the map of a query is the grid's."""
    config = 'projects/longrange/configs/ade20k_longrange_vit_nala.py'  # (a project's)
    torch.manual_seed(0)
    model, _ = build_model_from_config(config)
    model.init_weights()
    checkpoint = tmp_path / 'vit.pth'
    torch.save({'state_dict': model.state_dict()}, checkpoint)
    image = tmp_path / 'image.png'
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (128, 128, 3), np.uint8)).save(image)
    proc = run_tool(config, str(checkpoint), str(image), '--out-dir', str(tmp_path / 'out'),
                    '--points', '100,20')
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry, = json.loads((tmp_path / 'out' / 'attention_stats.json').read_text())['layers']
    assert (entry['layer'], entry['stage'], entry['grid']) == ('layers.0.attn.mixer', 0, [16, 16])
    assert entry['prefix_tokens'] == 1 and entry['tokens'] == 257
    assert entry['entropy_queries'] == 257 and entry['query_tokens'] == [[2, 12]]
    assert 0 < entry['query_prefix_weights'][0] < 1
    assert 0 < entry['prefix_row_entropy'] <= math.log(257)
    assert entry['saturated_share'] is not None  # a NaLa layer: its exponent's saturation
