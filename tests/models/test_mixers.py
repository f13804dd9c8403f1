"""Token mixers as registered building blocks: baselines, ablation switches, fast vs reference."""
import itertools

import pytest
import torch

from nala_mm.models import (
    GatedAttention,
    IdentityAttention,
    LinearAttention,
    NaLaFormer,
    NormAwareLinearAttention,
    SoftmaxAttention,
)
from nala_mm.ops import NaLaConfig, nala_attention, rope_table
from nala_mm.registry import register_model
from tests.helpers import TINY_ARCH as TINY
from tests.helpers import rel_err


def qkv(shape, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen) * scale).requires_grad_() for _ in range(3)]


def mixer_inputs(layer: GatedAttention, height=5, width=7, seed=0, scale=1.0):
    """q, k, v (B=2, heads, N, d) and the layer's RoPE table for an odd-sized map."""
    q, k, v = qkv((2, layer.num_heads, height * width, layer.head_dims), seed, scale)
    rope = rope_table(height, width, layer.head_dims) if layer.use_rope else None
    return q, k, v, rope


NALA_SETTINGS = [dict(kernel=kernel, norm_aware=norm_aware, use_rope=use_rope)
                 for kernel, norm_aware, use_rope in itertools.product(
                     ('cosine', 'relu', 'positive'), (True, False), (True, False))]
LINEAR_SETTINGS = [dict(feature_map=fm, use_rope=use_rope)
                   for fm, use_rope in itertools.product(('relu', 'elu'), (True, False))]
CASES = [(NormAwareLinearAttention, s) for s in NALA_SETTINGS] + \
        [(LinearAttention, s) for s in LINEAR_SETTINGS]


@pytest.mark.parametrize('cls, settings', CASES,
                         ids=[f'{c.__name__}-{"-".join(map(str, s.values()))}' for c, s in CASES])
def test_every_switch_keeps_fast_and_reference_equal(cls, settings):
    """Forward and q/k/v gradients, odd N, a zero query, ragged token chunks."""
    fast = cls(16, 2, **settings)
    reference = cls(16, 2, mode='reference', **settings)
    q, k, v, rope = mixer_inputs(fast)
    with torch.no_grad():
        q[0, 1, 4].zero_()
    expected = reference.mix(q, k, v, rope)
    actual = fast.mix(q, k, v, rope)
    assert rel_err(actual, expected) <= 1e-5
    grad_out = torch.randn_like(expected)
    for name, a, e in zip('qkv', torch.autograd.grad(actual, (q, k, v), grad_out),
                          torch.autograd.grad(expected, (q, k, v), grad_out)):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, e) <= 1e-5, name


def _query_scaling_change(layer: GatedAttention, factor: float, query_norm: float) -> float:
    q, k, v, rope = mixer_inputs(layer, seed=3)
    with torch.no_grad():
        q = q / q.norm(dim=-1, keepdim=True) * query_norm
        return rel_err(layer.mix(q * factor, k, v, rope), layer.mix(q, k, v, rope))


@pytest.mark.parametrize('factor', [0.25, 3.0])
def test_only_norm_aware_nala_sees_the_query_norm(factor):
    """||q|| = 0.3 per head here, where tanh is responsive (at ||q|| ~ 3 it saturates)."""
    plain = LinearAttention(16, 2)  # relu: positively homogeneous, the norm cancels
    fixed = NormAwareLinearAttention(16, 2, norm_aware=False)
    aware = NormAwareLinearAttention(16, 2)
    # exact but for the normaliser's eps = 1e-6, which weighs ~1e-4 where a query has few
    # positive components
    assert _query_scaling_change(plain, factor, 0.3) < 1e-3
    assert _query_scaling_change(fixed, factor, 0.3) < 1e-5
    assert _query_scaling_change(aware, factor, 0.3) > 1e-2


def test_positive_kernel_discards_signed_interactions():
    """A query and a key negative in every component interact under the released ReLU split
    (same sign) and not at all under the positive part."""
    q = -torch.rand(1, 1, 1, 8) - 0.1
    k = torch.cat([-torch.rand(1, 1, 1, 8) - 0.1, torch.rand(1, 1, 1, 8) + 0.1], dim=-2)
    v = torch.tensor([[[[1.0] * 8, [0.0] * 8]]])
    relu = nala_attention(q, k, v, NaLaConfig(kernel='relu'))
    positive = nala_attention(q, k, v, NaLaConfig(kernel='positive'))
    assert relu.min().item() > 0.99  # all weight on the same-sign key
    assert positive.abs().max().item() == 0.0  # no feature survives: no interaction at all


@pytest.mark.parametrize('layer', [
    NormAwareLinearAttention(16, 2), NormAwareLinearAttention(16, 2, kernel='positive'),
    LinearAttention(16, 2, feature_map='elu'), SoftmaxAttention(16, 2)],
    ids=['nala', 'nala-positive', 'linear-elu', 'softmax'])
def test_attention_weights_are_what_mixes_the_values(layer):
    """Rows of chosen queries equal those rows of the full weights, and weights @ v is the
    mixer's output: the inspection tool shows what the layer computes."""
    q, k, v, rope = mixer_inputs(layer, seed=4)
    with torch.no_grad():
        full = layer.attention_weights(q, k, rope)
        assert rel_err(full @ v, layer.mix(q, k, v, rope)) <= 1e-5
        rows = torch.tensor([0, 17, 34])
        assert rel_err(layer.attention_weights(q, k, rope, rows), full[..., rows, :]) <= 1e-6


def test_mixed_backbone_builds_in_both_scopes_with_the_same_parameters():
    from mmengine.registry import MODELS, DefaultScope
    mixed_types = ('linear', 'nala', 'softmax', 'linear')
    all_nala = NaLaFormer(arch=TINY, mixers=('nala',) * 4)
    for scope in ('mmseg', 'mmdet'):
        with DefaultScope.overwrite_default_scope(scope):
            mixed = MODELS.build(dict(type='NaLaFormer', arch=TINY, mixers=mixed_types))
        assert [type(s.blocks[0].attn) for s in mixed.layers] == [
            LinearAttention, NormAwareLinearAttention, SoftmaxAttention, LinearAttention]
        assert sum(p.numel() for p in mixed.parameters()) == \
            sum(p.numel() for p in all_nala.parameters())
    # the released weights of any mixer load into any other: same names, same shapes
    mixed.load_state_dict(all_nala.state_dict(), strict=True)
    image = torch.randn(1, 3, 61, 77, requires_grad=True)
    outs = mixed(image)
    sum(o.square().mean() for o in outs).backward()
    assert image.grad is not None and torch.isfinite(image.grad).all()
    assert all(p.grad is not None for p in mixed.parameters() if p.requires_grad)


def test_mixer_config_dicts_reach_the_layers():
    model = NaLaFormer(arch=TINY, mixers=(
        dict(type='NormAwareLinearAttention', kernel='relu'),
        dict(type='NormAwareLinearAttention', kernel='positive', norm_aware=False, use_rope=False),
        dict(type='LinearAttention', feature_map='elu'),
        dict(type='SoftmaxAttention')))
    first, second, third = (model.layers[i].blocks[0].attn for i in range(3))
    assert first.cfg.kernel == 'relu' and first.cfg.norm_aware
    assert (second.cfg.kernel, second.cfg.norm_aware, second.use_rope) == ('positive', False,
                                                                          False)
    assert third.feature_map == 'elu'


@register_model
class MeanPoolMixer(GatedAttention):
    """A user's own mixer: every token takes the mean value (for the registry test)."""
    mix_in_float32 = False

    def mix(self, q, k, v, rope):
        return v.mean(dim=-2, keepdim=True).expand_as(v)


def test_a_user_registered_mixer_is_named_in_a_config():
    from mmengine.config import Config
    from mmengine.registry import MODELS, DefaultScope
    cfg = Config(dict(model=dict(type='NaLaFormer', arch=TINY,
                                 mixers=['nala', dict(type='MeanPoolMixer'), 'softmax',
                                             'softmax'])))
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model)
    assert isinstance(model.layers[1].blocks[0].attn, MeanPoolMixer)
    assert model.layers[1].blocks[0].attn.qkvg.weight.shape == (128, 32)
    assert all(torch.isfinite(o).all() for o in model(torch.randn(1, 3, 40, 40)))


@register_model
class NotAMixer(torch.nn.Module):
    """Registered, takes a mixer's sizes, but lacks the shared wrapper."""

    def __init__(self, embed_dims, num_heads):
        super().__init__()


@pytest.mark.parametrize('entry, error, match', [
    ('flash', ValueError, "'flash'"),
    (dict(kernel='relu'), TypeError, "a 'type'"),
    (dict(type='NotAMixer'), TypeError, "'NotAMixer' built a NotAMixer.*GatedAttention"),
    (dict(type='SoftmaxAttention', embed_dims=8), ValueError, 'takes its sizes from the stage'),
    (dict(type='NormAwareLinearAttention', kernel='sigmoid'), ValueError, "'sigmoid'"),
    (dict(type='NormAwareLinearAttention', norm_aware='no'), TypeError, "norm_aware.*'no'"),
    (dict(type='LinearAttention', feature_map='softplus'), ValueError, "'softplus'"),
])
def test_bad_mixer_entries_name_the_value(entry, error, match):
    with pytest.raises(error, match=match):
        NaLaFormer(arch=TINY, mixers=('nala', entry, 'softmax', 'softmax'))


@pytest.mark.parametrize('cls, reaches', [(IdentityAttention, False),
                                          (NormAwareLinearAttention, True),
                                          (SoftmaxAttention, True)])
def test_only_a_mixing_layer_carries_a_far_token_to_another(cls, reaches):
    """Perturb the top-left token: at the bottom-right one, beyond LePE's 5x5 window, the output
    moves through a mixing layer and stays exactly the same through the identity control."""
    layer = cls(16, 2).eval()
    x = torch.randn(1, 9, 11, 16)
    moved = x.clone()
    moved[0, 0, 0] += 3.0
    with torch.no_grad():
        before, after = layer(x), layer(moved)
    change = (after[0, -1, -1] - before[0, -1, -1]).abs().max().item()
    assert (change > 1e-4) if reaches else (change == 0.0)
    # the perturbed token's own output moves in every case (LePE and the projections see it)
    assert (after[0, 0, 0] - before[0, 0, 0]).abs().max() > 1e-3


def test_identity_control_has_every_mixers_parameters_and_attends_to_itself():
    control, nala = IdentityAttention(16, 2), NormAwareLinearAttention(16, 2)
    assert [(n, p.shape) for n, p in control.named_parameters()] == \
        [(n, p.shape) for n, p in nala.named_parameters()]
    q, k, _, _, rope = control.project(torch.randn(1, 4, 5, 16))
    weights = control.attention_weights(q, k, rope, rows=torch.tensor([0, 7]))
    assert weights.shape == (1, 2, 2, 20)
    assert torch.equal(weights[0, 1], torch.eye(20)[[0, 7]])
