"""NaLaFormer backbone: shapes, arguments, parameter counts, the checkpoint layout of earlier
versions, training controls. Loading the authors' checkpoints:
tests/test_pretrained.py."""
import math
import os.path as osp

import pytest
import torch

from nala_mm.models import DEFAULT_HYBRID, NaLaFormer
from tests.helpers import REPO, rel_err
from tests.helpers import TINY_ARCH as TINY
from tests.reference.released_nalaformer import (
    CLASSIFICATION_TAIL,
    VARIANTS,
    RoPE,
    released_frequencies,
    released_variant,
)

RELU = dict(type='NormAwareLinearAttention', kernel='relu')


def test_variant_outputs_have_the_stage_widths_at_strides_4_to_32():
    model = NaLaFormer(arch='t').eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 96))
    assert [tuple(o.shape) for o in outs] == [(1, c, 64 // s, 96 // s) for c, s in
                                              zip(VARIANTS['t']['dims'], (4, 8, 16, 32))]


@pytest.mark.parametrize('size', [(255, 255), (112, 137), (32, 32), (17, 23)])
def test_odd_sizes_give_ceil_divided_maps(size):
    model = NaLaFormer(arch=TINY, mixers=('nala',) * 4).eval()
    with torch.no_grad():
        outs = model(torch.randn(2, 3, *size))
    for out, stride, dims in zip(outs, (4, 8, 16, 32), TINY['embed_dims']):
        assert tuple(out.shape) == (2, dims, math.ceil(size[0] / stride),
                                    math.ceil(size[1] / stride))


def test_out_indices_select_stages():
    model = NaLaFormer(arch=TINY, out_indices=(1, 3)).eval()
    outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [32, 64]
    assert not hasattr(model, 'out_norm0') and hasattr(model, 'out_norm3')


def test_without_out_norm_cfg_the_raw_stage_features_are_returned():
    torch.manual_seed(0)
    normed = NaLaFormer(arch=TINY, out_indices=(0, 2)).eval()
    raw = NaLaFormer(arch=TINY, out_indices=(0, 2), out_norm_cfg=None).eval()
    missing, unexpected = raw.load_state_dict(normed.state_dict(), strict=False)
    assert missing == [] and sorted(unexpected) == sorted(
        k for k in normed.state_dict() if k.startswith('out_norm'))
    image = torch.randn(2, 3, 48, 40)
    with torch.no_grad():
        for i, with_norm, without in zip((0, 2), normed(image), raw(image)):
            norm = getattr(normed, f'out_norm{i}')  # over channels: tokens (B, H, W, C)
            expected = norm(without.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            assert torch.allclose(with_norm, expected, atol=1e-6)
            # really un-normalised: per-pixel channel statistics are not 0 / 1
            assert without.std(1).sub(1).abs().mean() > 0.05
    assert not any('out_norm' in n for n, _ in raw.named_parameters())


def test_out_norms_are_built_from_the_norm_config_under_the_released_key_names():
    model = NaLaFormer(arch=TINY, out_indices=(1, 3), out_norm_cfg=dict(type='LN', eps=1e-5))
    norm = model.out_norm3.norm
    assert isinstance(norm, torch.nn.LayerNorm) and norm.eps == 1e-5
    assert norm.normalized_shape == (64,)
    assert sorted(k for k in model.state_dict() if k.startswith('out_norm')) == [
        'out_norm1.norm.bias', 'out_norm1.norm.weight', 'out_norm3.norm.bias',
        'out_norm3.norm.weight']
    # a norm over dim 1 (here GroupNorm) sees the channels-first map, not the tokens
    grouped = NaLaFormer(arch=TINY, out_indices=(3,),
                         out_norm_cfg=dict(type='GN', num_groups=4)).eval()
    raw = NaLaFormer(arch=TINY, out_indices=(3,), out_norm_cfg=None).eval()
    raw.load_state_dict(grouped.state_dict(), strict=False)
    image = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(grouped(image)[0], grouped.out_norm3.norm(raw(image)[0]),
                              atol=1e-6)


def shapes(named) -> dict:
    return {name: tuple(t.shape) for name, t in named}


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_variants_have_the_released_parameters(variant):
    """Against the authors' table (tests/reference): every parameter of the released backbone
    (classification tail left out) under the same name and shape, nothing else, so exactly
    the released count; the per-output norms, an addition for dense heads, add 2 C each."""
    with torch.device('meta'):
        released = released_variant(variant)
        ours = NaLaFormer(arch=variant, out_norm_cfg=None)
        normed = NaLaFormer(arch=variant)
    backbone = {name: shape for name, shape in shapes(released.named_parameters()).items()
                if not name.startswith(CLASSIFICATION_TAIL)}
    assert shapes(ours.named_parameters()) == backbone
    assert sum(p.numel() for p in ours.parameters()) == \
        sum(math.prod(shape) for shape in backbone.values())
    # buffers too (BN statistics), but for the RoPE frequencies, which ours rebuilds
    released_state = {name: shape for name, shape in shapes(released.state_dict().items()).items()
                      if not name.startswith(CLASSIFICATION_TAIL) and 'RoPE' not in name}
    assert shapes(ours.state_dict().items()) == released_state

    extra = {name: shape for name, shape in shapes(normed.named_parameters()).items()
             if name not in backbone}
    dims = VARIANTS[variant]['dims']
    assert extra == {f'out_norm{i}.norm.{p}': (c,) for i, c in enumerate(dims)
                     for p in ('weight', 'bias')}
    assert sum(p.numel() for p in normed.parameters()) - \
        sum(p.numel() for p in ours.parameters()) == 2 * sum(dims)

    # what the parameter shapes cannot show: heads, LayerScale init, drop-path rate
    table = VARIANTS[variant]
    assert [s.blocks[0].attn.num_heads for s in ours.layers] == list(table['heads'])
    settings = ours.arch_settings
    assert tuple(settings['layer_scale_init_values']) == table['layer_scales']
    assert tuple(settings['mlp_ratios']) == (table['mlp_ratio'],) * 4
    assert settings['drop_path_rate'] == table['drop_path']


def test_layer_scale_starts_at_the_stage_init_value():
    model = NaLaFormer(arch=dict(TINY, layer_scale_init_values=(1.0, 0.5, 1e-6, 2e-6)))
    for stage, init in zip(model.layers, (1.0, 0.5, 1e-6, 2e-6)):
        for block in stage.blocks:
            for gamma in (block.gamma_1, block.gamma_2):
                assert torch.equal(gamma, torch.full_like(gamma, init))


V0_CHECKPOINT = osp.join(REPO, 'tests', 'data', 'nalaformer_v0_tiny.pth')
V0_ARCH = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2),
               mlp_ratios=(2,) * 4, layer_scale_init_values=(1.,) * 4, drop_path_rate=0.)


def test_a_state_dict_of_the_earlier_layout_loads_strictly_and_computes_the_same():
    """tests/data/nalaformer_v0_tiny.pth holds the state dict of a tiny hybrid NaLaFormer with
    per-output norms, its input and its outputs, written by the code at the commit in its
    ``meta``. Every tensor was moved
    off its initial value, and all values are float16-representable, so the file stores them as
    float16 exactly."""
    saved = torch.load(V0_CHECKPOINT, weights_only=True)
    model = NaLaFormer(arch=V0_ARCH, mixers=DEFAULT_HYBRID).eval()
    model.load_state_dict(saved['state_dict'], strict=True)
    with torch.no_grad():
        outs = model(saved['input'].float())
    assert len(outs) == len(saved['outputs']) == 4
    # float32 rounding only: the kernels' summation order depends on the thread count (1 thread
    # differs from the file's 2 by up to 1.3e-6)
    for out, expected in zip(outs, saved['outputs']):
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize('head_dim', [4, 8, 12, 16, 32, 64])
def test_rope_tables_use_the_released_frequencies(head_dim):
    """d/4 = 1 included: the released linspace(0, 1, 1) gives the single frequency 1."""
    from nala_mm.ops import rope_angle_buffer, rope_frequencies, rope_table
    reference = RoPE(head_dim)
    assert torch.allclose(rope_frequencies(head_dim), released_frequencies(head_dim), rtol=1e-6)
    assert torch.allclose(rope_angle_buffer(head_dim), reference.angle, rtol=1e-6)
    assert rope_frequencies(head_dim)[-1].item() == pytest.approx(1e-4 if head_dim > 4 else 1.0)
    sin, cos = reference(5, 7)  # (N, d): every channel of a pair carries the pair's angle
    ours_cos, ours_sin = rope_table(5, 7, head_dim)  # (N, d/2): one entry per pair
    assert torch.allclose(ours_cos, cos[:, 0::2], atol=1e-6)
    assert torch.allclose(ours_sin, sin[:, 1::2], atol=1e-6)


def test_with_cp_gives_same_outputs_and_gradients():
    torch.manual_seed(0)
    plain = NaLaFormer(arch=TINY, drop_path_rate=0.0)
    ckpt = NaLaFormer(arch=TINY, drop_path_rate=0.0, with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 48, 40)
    out_plain, out_ckpt = plain(x), ckpt(x)
    for a, b in zip(out_plain, out_ckpt):
        assert rel_err(b, a) <= 1e-6
    sum(o.square().mean() for o in out_plain).backward()
    sum(o.square().mean() for o in out_ckpt).backward()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert rel_err(q.grad, p.grad) <= 1e-5, name


@pytest.mark.parametrize('out_norm_cfg', [dict(type='LN', eps=1e-6), None], ids=['LN', 'none'])
@pytest.mark.parametrize('frozen_stages', [0, 2])
def test_frozen_stages_stay_frozen_and_in_eval(frozen_stages, out_norm_cfg):
    model = NaLaFormer(arch=TINY, frozen_stages=frozen_stages, out_norm_cfg=out_norm_cfg)
    model.train()
    frozen = [model.patch_embed] + list(model.layers[:frozen_stages])
    trainable = list(model.layers[frozen_stages:])
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(not m.training for f in frozen for m in f.modules())
    assert all(p.requires_grad for m in trainable for p in m.parameters())
    assert all(m.training for t in trainable for m in t.modules())
    # frozen BN statistics do not move in a training forward
    bn = model.patch_embed.proj[1]
    before = bn.running_mean.clone()
    model(torch.randn(2, 3, 32, 32) * 3 + 1)
    assert torch.equal(bn.running_mean, before)


def test_norm_eval_keeps_batchnorm_statistics():
    model = NaLaFormer(arch=TINY, norm_eval=True).train()
    bn = model.layers[0].downsample.norm
    before = bn.running_mean.clone()
    model(torch.randn(2, 3, 32, 32) * 3 + 1)
    assert not bn.training and torch.equal(bn.running_mean, before)
    moving = NaLaFormer(arch=TINY).train()
    moving(torch.randn(2, 3, 32, 32) * 3 + 1)
    assert not torch.equal(moving.layers[0].downsample.norm.running_mean, before)


def test_all_linear_backbone_uses_nala_everywhere():
    from nala_mm.models import NormAwareLinearAttention, SoftmaxAttention
    hybrid = NaLaFormer(arch=TINY)
    linear = NaLaFormer(arch=TINY, mixers=(RELU,) * 4)
    assert [type(s.blocks[0].attn) for s in hybrid.layers] == \
        [NormAwareLinearAttention] * 2 + [SoftmaxAttention] * 2
    assert all(isinstance(s.blocks[0].attn, NormAwareLinearAttention) for s in linear.layers)
    assert linear.layers[3].blocks[0].attn.cfg.kernel == 'relu'


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(arch='xxl'), ValueError, "'xxl'"),
    (dict(arch=dict(TINY, depths=(1, 1, 1))), ValueError, r"arch\['depths'\]"),
    (dict(arch=TINY, mixers=('nala', 'flash', 'nala', 'nala')), ValueError,
     r"unknown mixer 'flash'; expected one of \('nala', 'linear', 'softmax', 'window', 'sdpa'\)"),
    (dict(arch=TINY, mixers=('nala',) * 3), ValueError, r'mixers needs 4 entries.*\(\'nala\','),
    (dict(arch=TINY, mixers='nala'), TypeError, "one entry per stage.*'nala'"),
    (dict(arch=TINY, mixers=('nala', dict(kernel='relu'), 'nala', 'nala')), TypeError,
     "a 'type'.*'kernel': 'relu'"),
    (dict(arch=TINY, out_indices=(0, 4)), ValueError, r'\(0, 4\)'),
    (dict(arch=TINY, frozen_stages=5), ValueError, 'frozen_stages.*5'),
    (dict(arch=3), TypeError, 'int'),
    # a typo must not silently fall back to the default ratio
    (dict(arch=dict(TINY, mlp_ratio=(3, 3, 3, 3))), ValueError, r"unknown keys \['mlp_ratio'\]"),
])
def test_bad_arguments_name_the_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        NaLaFormer(**kwargs)


@pytest.mark.parametrize('bad, error, match', [
    (torch.randn(1, 1, 32, 32), ValueError, r'\(1, 1, 32, 32\)'),
    (torch.randn(3, 32, 32), ValueError, r'\(3, 32, 32\)'),
    ([1, 2, 3], TypeError, 'list'),
])
def test_bad_input_names_the_shape(bad, error, match):
    with pytest.raises(error, match=match):
        NaLaFormer(arch=TINY)(bad)


@pytest.mark.parametrize('scope', ['mmseg', 'mmdet'])
def test_builds_under_default_scope(scope):
    from mmengine.registry import MODELS, DefaultScope
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(dict(type='NaLaFormer', arch='xt', out_indices=(2,)))
    assert isinstance(model, NaLaFormer) and model.embed_dims == VARIANTS['xt']['dims']


def test_drop_path_residual_is_mmcv_drop_path_in_one_pass():
    """The block's fused residual draws DropPath's per-sample mask as mmcv's DropPath does and
    gives its output: x + DropPath(gamma * branch), dropped samples keep x exactly."""
    from mmcv.cnn.bricks import DropPath
    model = NaLaFormer(arch=dict(embed_dims=(8, 8, 8, 8), depths=(1, 1, 1, 1),
                                 num_heads=(1, 1, 1, 1)), drop_path_rate=0.5)
    block = model.layers[3].blocks[0]  # the last block gets the full rate
    block.train()
    torch.manual_seed(0)
    x, branch = torch.randn(16, 3, 5, 8), torch.randn(16, 3, 5, 8)
    gamma = torch.rand(1, 8, 1, 1)
    torch.manual_seed(1)
    got = block._residual(x, gamma, branch)
    torch.manual_seed(1)
    want = x + DropPath(0.5)(gamma.view(-1) * branch)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    kept = [(got[i] - x[i]).abs().max().item() > 0 for i in range(16)]
    assert 0 < sum(kept) < 16  # both outcomes occur at this rate and seed
    block.eval()
    torch.testing.assert_close(block._residual(x, gamma, branch), x + gamma.view(-1) * branch)
