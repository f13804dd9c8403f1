"""NaLa attention: fast path vs reference, the paper's properties, autocast, bad input."""
import math

import pytest
import torch
import torch.nn.functional as F

from nala_mm.models import NormAwareLinearAttention, SoftmaxAttention
from nala_mm.ops import (
    NaLaConfig,
    apply_rope,
    apply_rope_reference,
    kernelized_attention_weights,
    nala_attention,
    rope_phasor,
    rope_table,
)
from tests.helpers import DEVICES, rel_err
from tests.reference import formulas
from tests.reference.released_nalaformer import RoPE, released_nala, rotate
from tests.reference.released_op import nala_attention_released


def attention_matrix(q, k, cfg, rope=None):
    """NaLa's implied N x N attention (quadratic memory: tests only)."""
    return kernelized_attention_weights(q, k, *cfg.feature_maps(), cfg.eps, rope, rope)


def qkv(shape, seed=0, dtype=torch.float32, scale=1.0, device='cpu'):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen, dtype=dtype) * scale).to(device).requires_grad_()
            for _ in range(3)]


def on(device, table):
    return None if table is None else tuple(t.to(device) for t in table)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
@pytest.mark.parametrize('use_rope', [False, True])
def test_fast_matches_reference_forward_and_gradients(kernel, use_rope, device):
    height, width, head_dim = 5, 7, 8  # N = 35: odd
    q, k, v = qkv((2, 3, height * width, head_dim), device=device)
    with torch.no_grad():
        q[0, 1, 4].zero_()  # a zero query exercises the 0/0 guard in both paths
    cfg = NaLaConfig(kernel=kernel)
    rope = on(device, rope_table(height, width, head_dim) if use_rope else None)
    expected = nala_attention(q, k, v, cfg, rope, mode='reference')
    actual = nala_attention(q, k, v, cfg, rope)
    assert rel_err(actual, expected) <= 1e-5
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    actual_grads = torch.autograd.grad(actual, (q, k, v), grad_out)
    for name, a, e in zip('qkv', actual_grads, expected_grads):
        assert rel_err(a, e) <= 1e-5, name


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
@pytest.mark.parametrize('chunk', [1, 7, 50])
def test_token_chunking_does_not_change_results(kernel, chunk, device):
    height, width, head_dim = 9, 13, 8  # N = 117: chunks of 7 and 50 leave ragged tails
    q, k, v = qkv((2, 2, height * width, head_dim), seed=5, device=device)
    cfg, rope = NaLaConfig(kernel=kernel), on(device, rope_table(height, width, head_dim))
    expected = nala_attention(q, k, v, cfg, rope, mode='reference')
    actual = nala_attention(q, k, v, cfg, rope, chunk=chunk)
    assert rel_err(actual, expected) <= 1e-5
    grad_out = torch.randn_like(expected)
    for a, e in zip(torch.autograd.grad(actual, (q, k, v), grad_out),
                    torch.autograd.grad(expected, (q, k, v), grad_out)):
        assert rel_err(a, e) <= 1e-5
    with pytest.raises(ValueError, match='chunk=0'):
        nala_attention(q, k, v, cfg, rope, chunk=0)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
def test_layer_fast_matches_reference_including_parameter_gradients(kernel, device):
    torch.manual_seed(0)
    fast = NormAwareLinearAttention(16, 2, kernel=kernel).to(device)
    ref = NormAwareLinearAttention(16, 2, kernel=kernel, mode='reference').to(device)
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 5, 9, 16).to(device)  # channels-last tokens
    out_fast, out_ref = fast(x), ref(x)
    assert out_fast.shape == x.shape
    assert rel_err(out_fast, out_ref) <= 1e-5
    out_fast.square().sum().backward()
    out_ref.square().sum().backward()
    for (name, p_fast), p_ref in zip(fast.named_parameters(), ref.parameters()):
        assert rel_err(p_fast.grad, p_ref.grad) <= 1e-5, name


@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
def test_fast_path_refuses_double_backward(kernel):
    """The hand-written backward op has no derivative of its own: second-order gradients (e.g. a
    gradient penalty) must fail loudly, not come back silently wrong."""
    q, k, v = qkv((1, 1, 12, 8), seed=6)
    out = nala_attention(q, k, v, NaLaConfig(kernel=kernel), rope_table(3, 4, 8))
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match='backward through nala_mm.kernelized_\\w+_backward'
                                           '.default but no autograd formula'):
        grad_q.sum().backward()


def released_tables(height: int, width: int, head_dim: int):
    """The transcription's own RoPE: (sin, cos), each (N, d), one angle per channel."""
    return RoPE(head_dim)(height, width)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('use_rope', [True, False])
def test_fast_relu_kernel_matches_the_released_transcription(use_rope, device):
    """The package's fast op with its own RoPE table against the released op sequence
    (tests/reference/released_op.py, through released_nala) with the transcription's tables, or
    zero angles against no RoPE: outputs and gradients."""
    height, width, head_dim = 4, 6, 8
    q, k, v = qkv((1, 2, height * width, head_dim), seed=3, device=device)
    sin, cos = on(device, released_tables(height, width, head_dim))
    if not use_rope:
        sin, cos = torch.zeros_like(sin), torch.ones_like(cos)
    expected = released_nala(q, k, v, sin, cos)
    rope = on(device, rope_table(height, width, head_dim) if use_rope else None)
    actual = nala_attention(q, k, v, NaLaConfig(kernel='relu'), rope)
    assert rel_err(actual, expected) <= 1e-5
    grad_out = torch.randn_like(expected)
    for name, a, e in zip('qkv', torch.autograd.grad(actual, (q, k, v), grad_out),
                          torch.autograd.grad(expected, (q, k, v), grad_out)):
        assert rel_err(a, e) <= 1e-5, name


def test_released_op_without_rope_is_zero_angles_and_a_zero_query_mixes_nothing():
    """The transcription's own branches: ``rope=None`` computes what zero angles do, and a
    zero query (guarded, where the released code divides 0 by 0) gives a zero output row, as
    the fast path does."""
    height, width, head_dim = 4, 6, 8
    q, k, v = (t.detach() for t in qkv((1, 2, height * width, head_dim), seed=4))
    q[0, 1, 5] = 0.0
    half = head_dim // 2
    zero_angles = (torch.ones(height * width, half), torch.zeros(height * width, half))
    plain = nala_attention_released(q, k, v)
    assert rel_err(plain, nala_attention_released(q, k, v, rope=zero_angles)) <= 1e-6
    rope = released_tables(height, width, head_dim)
    rotated = released_nala(q, k, v, *rope)
    for out in (plain, rotated):
        assert torch.isfinite(out).all()
        assert out[0, 1, 5].abs().max() == 0
    fast = nala_attention(q, k, v, NaLaConfig(kernel='relu'), rope_table(height, width, head_dim))
    assert rel_err(fast, rotated) <= 1e-5


def test_fast_rope_matches_plain_rotation_and_inverts():
    cos, sin = rope_table(3, 5, 8)
    x = torch.randn(2, 15, 16)  # two d-wide halves, as NaLa's 2d-wide features
    phasor = rope_phasor(cos, sin)
    rotated = apply_rope(x, phasor)
    assert rel_err(rotated, apply_rope_reference(x, cos, sin)) <= 1e-6
    # the transcription's rotation, each d-wide half on its own, with its own (N, d) tables
    ref_sin, ref_cos = released_tables(3, 5, 8)
    expected = torch.cat([rotate(half, ref_sin, ref_cos) for half in x.split(8, dim=-1)], -1)
    assert rel_err(rotated, expected) <= 1e-6
    assert rel_err(apply_rope(rotated, phasor, inverse=True), x) <= 1e-6
    # a rotation: norms per token unchanged, token 0 (angle 0) untouched
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    assert torch.allclose(rotated[:, 0], x[:, 0])


def test_rope_scores_depend_on_relative_position_only():
    """Row/column shifts of both tokens leave q.k unchanged: the point of RoPE."""
    height, width, head_dim = 6, 6, 8
    cos, sin = rope_table(height, width, head_dim)
    q, k = torch.randn(head_dim), torch.randn(head_dim)

    def score(pos_q, pos_k):
        iq, ik = pos_q[0] * width + pos_q[1], pos_k[0] * width + pos_k[1]
        rq = apply_rope_reference(q[None], cos[iq:iq + 1], sin[iq:iq + 1])
        rk = apply_rope_reference(k[None], cos[ik:ik + 1], sin[ik:ik + 1])
        return (rq * rk).sum().item()

    assert score((1, 2), (3, 1)) == pytest.approx(score((2, 4), (4, 3)), rel=1e-4)
    assert score((1, 2), (3, 1)) != pytest.approx(score((1, 2), (1, 3)), rel=1e-3)


@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
def test_implied_attention_is_a_distribution_without_rope(kernel):
    q, k, _ = qkv((2, 2, 40, 8), seed=1, dtype=torch.float64)
    attn = attention_matrix(q, k * 2, NaLaConfig(kernel=kernel))
    assert attn.min().item() >= 0
    assert (attn.sum(-1) - 1).abs().max().item() <= 1e-5
    # the linear form computes exactly this matrix times v
    v = torch.randn(2, 2, 40, 8, dtype=torch.float64)
    out = nala_attention(q, k * 2, v, NaLaConfig(kernel=kernel), mode='reference')
    assert rel_err(out, attn @ v) <= 1e-10


def _row_entropy(q, k, cfg=None):
    if cfg is None:  # plain ReLU linear attention: the norm of q cancels
        scores = F.relu(q) @ F.relu(k).transpose(-1, -2)
        row = scores / scores.sum(-1, keepdim=True)
    else:
        row = attention_matrix(q, k, cfg)
    row = row.flatten()
    return -(row * row.clamp_min(1e-300).log()).sum().item()


def _formula_entropy(q, k, kernel):
    """The same row from tests/reference/formulas.py's features (docs/user_guides/method.md):
    weight j is phi(q).phi(k_j) / (sum_i phi(q).phi(k_i) + N eps)."""
    scores = (formulas.nala_key_features(k, kernel) @
              formulas.nala_query_features(q, kernel).transpose(-1, -2)).flatten()
    row = scores / (scores.sum() + scores.numel() * 1e-6)
    return -(row * torch.where(row > 0, row.log(), torch.zeros_like(row))).sum().item()


@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
def test_entropy_falls_as_query_norm_grows(kernel):
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(1, 1, 64, 16, generator=gen, dtype=torch.float64)
    direction = torch.randn(16, generator=gen, dtype=torch.float64)
    direction = direction / direction.norm()
    norms = torch.linspace(0.1, 2.0, 12)
    queries = [(direction * r).view(1, 1, 1, -1) for r in norms]
    nala = [_row_entropy(q, keys, NaLaConfig(kernel=kernel)) for q in queries]
    expected = [_formula_entropy(q, keys, kernel) for q in queries]
    assert nala == pytest.approx(expected, rel=1e-9)
    assert all(a > b for a, b in zip(nala, nala[1:])), nala
    plain = [_row_entropy(q, keys) for q in queries]
    assert max(plain) - min(plain) < 1e-12  # plain linear attention cannot see the norm


@pytest.mark.parametrize('use_rope', [False, True])
def test_cosine_kernel_tends_to_relu_kernel(use_rope):
    """How far the cosine kernel is from the ReLU split at alpha = 1e3 (~2e-10) and 20 (~3e-4):
    the distances tests/reference/formulas.py gives."""
    q, k, v = qkv((2, 2, 30, 8), seed=2, dtype=torch.float64)
    q, k, v = q.detach(), k.detach(), v.detach()
    rope = tuple(t.double() for t in rope_table(5, 6, 8)) if use_rope else None
    formula_rope = formulas.rope_tables(5, 6, 8) if use_rope else None
    relu = nala_attention(q, k, v, NaLaConfig(kernel='relu'), rope, mode='reference')
    formula_relu = formulas.nala(q, k, v, kernel='relu', rope=formula_rope)
    for alpha in (1e3, 20.0):
        cosine = nala_attention(q, k, v, NaLaConfig(kernel='cosine', alpha=alpha), rope,
                                mode='reference')
        want = rel_err(formulas.nala(q, k, v, kernel='cosine', alpha=alpha, rope=formula_rope),
                       formula_relu)
        assert rel_err(cosine, relu) == pytest.approx(want, rel=1e-4), alpha


@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
def test_zero_query_gives_finite_output_and_gradient(kernel):
    q, k, v = qkv((1, 1, 12, 8), seed=4)
    q = q.detach().clone()
    q[0, 0, 5] = 0
    q.requires_grad_()
    cfg = NaLaConfig(kernel=kernel)
    out = nala_attention(q, k, v, cfg, rope_table(3, 4, 8))
    assert torch.isfinite(out).all()
    assert out[0, 0, 5].abs().max().item() == 0  # no direction -> no features -> zero output
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    # |q / floor|^p with p >= 1.5 is flat at q = 0, and a query moves only its own row
    assert q.grad[0, 0, 5].abs().max().item() == 0
    assert q.grad[0, 0, torch.arange(12) != 5].abs().min().item() > 0


@pytest.mark.parametrize('cls', [NormAwareLinearAttention, SoftmaxAttention])
def test_bf16_autocast_is_finite_and_close_to_fp32(cls):
    torch.manual_seed(0)
    layer = cls(32, 2).eval()
    # 40 is large enough that k^3 (~6e4 per component, ~1e10 in the key mean's dot product)
    # overflows fp16 and loses bf16 precision: the math must run in float32.
    with torch.no_grad():
        layer.qkvg.weight.mul_(40 if cls is NormAwareLinearAttention else 1)
    x = torch.randn(1, 8, 12, 32)
    with torch.no_grad():
        expected = layer(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            actual = layer(x)
    assert actual.dtype == torch.bfloat16
    assert torch.isfinite(actual).all()
    assert rel_err(actual.float(), expected) <= 1e-2


def test_softmax_attention_matches_explicit_softmax():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 20, 8) for _ in range(3))
    layer = SoftmaxAttention(16, 2, use_rope=False)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1) @ v
    assert rel_err(layer.mix(q, k, v, None), expected) <= 1e-5


@pytest.mark.parametrize('kwargs, match', [
    (dict(embed_dims=24, num_heads=4), 'head_dim=6'),
    (dict(embed_dims=30, num_heads=4), 'embed_dims=30, num_heads=4'),
    (dict(embed_dims=32, num_heads=2, kernel='softplus'), "'softplus'"),
    (dict(embed_dims=32, num_heads=2, alpha=0.0), 'alpha=0.0'),
    (dict(embed_dims=32, num_heads=2, lam=-1.0), 'lam=-1.0'),
    (dict(embed_dims=32, num_heads=2, mode='cuda'), "'cuda'"),
])
def test_bad_arguments_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NormAwareLinearAttention(**kwargs)


def test_layers_build_from_registries():
    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.registry import MODELS as ENGINE_MODELS
    from mmseg.registry import MODELS as SEG_MODELS
    for registry in (ENGINE_MODELS, SEG_MODELS, DET_MODELS):
        layer = registry.build(dict(type='NormAwareLinearAttention', embed_dims=16, num_heads=1,
                                    kernel='relu'))
        assert isinstance(layer, NormAwareLinearAttention) and layer.cfg.kernel == 'relu'
        assert isinstance(registry.build(dict(type='SoftmaxAttention', embed_dims=16,
                                              num_heads=1)), SoftmaxAttention)


def test_under_autocast_softmax_attends_in_bf16_and_nala_in_float32(monkeypatch):
    """SDPA gets the autocast dtype (its fused 16-bit kernels), NaLa's op float32 (k^3)."""
    seen = {}
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen['sdpa'] = (q.dtype, k.dtype, v.dtype)
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, 'scaled_dot_product_attention', spy)
    x = torch.randn(1, 6, 8, 32)
    nala = NormAwareLinearAttention(32, 2)
    original_mix = nala.mix

    def nala_spy(q, k, v, rope):
        seen['nala'] = q.dtype
        return original_mix(q, k, v, rope)

    nala.mix = nala_spy
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        SoftmaxAttention(32, 2)(x)
        nala(x)
    assert seen['sdpa'] == (torch.bfloat16,) * 3
    assert seen['nala'] == torch.float32
