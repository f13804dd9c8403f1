"""NaLaFormer backbone: shapes, authors' checkpoints, parameter counts, training controls."""
import math

import pytest
import torch
import torch.nn.functional as F

from nala_mm.models import ARCH_SETTINGS, NaLaFormer, filter_authors_checkpoint
from tests.authors_layout_model import AuthorsNaLaFormer

TINY = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 4),
            mlp_ratios=(2, 2, 2, 2))


def rel_err(actual, expected):
    return ((actual - expected).norm() / expected.norm()).item()


def test_variant_shapes_at_224():
    model = NaLaFormer(arch='t').eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 224, 224))
    assert [tuple(o.shape) for o in outs] == [(1, 64, 56, 56), (1, 128, 28, 28), (1, 256, 14, 14),
                                              (1, 512, 7, 7)]


@pytest.mark.parametrize('size', [(255, 255), (112, 137), (32, 32), (17, 23)])
def test_odd_sizes_give_ceil_divided_maps(size):
    model = NaLaFormer(arch=TINY, attn_types=('nala',) * 4).eval()
    with torch.no_grad():
        outs = model(torch.randn(2, 3, *size))
    for out, stride, dims in zip(outs, (4, 8, 16, 32), TINY['embed_dims']):
        assert tuple(out.shape) == (2, dims, math.ceil(size[0] / stride),
                                    math.ceil(size[1] / stride))
        assert torch.isfinite(out).all()


def test_out_indices_select_stages():
    model = NaLaFormer(arch=TINY, out_indices=(1, 3)).eval()
    outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [32, 64]
    assert not hasattr(model, 'out_norm0') and hasattr(model, 'out_norm3')


def test_out_norm_off_returns_the_raw_stage_features():
    torch.manual_seed(0)
    normed = NaLaFormer(arch=TINY, out_indices=(0, 2)).eval()
    raw = NaLaFormer(arch=TINY, out_indices=(0, 2), out_norm=False).eval()
    missing, unexpected = raw.load_state_dict(normed.state_dict(), strict=False)
    assert missing == [] and sorted(unexpected) == sorted(
        k for k in normed.state_dict() if k.startswith('out_norm'))
    image = torch.randn(2, 3, 48, 40)
    with torch.no_grad():
        for i, with_norm, without in zip((0, 2), normed(image), raw(image)):
            assert torch.allclose(with_norm, getattr(normed, f'out_norm{i}')(without), atol=1e-6)
            # really un-normalised: per-pixel channel statistics are not 0 / 1
            assert without.std(1).sub(1).abs().mean() > 0.05
    assert not any('out_norm' in n for n, _ in raw.named_parameters())


# Backbone parameters without the classification tail (issue #4), +-0.5 %.
EXPECTED_PARAMS_M = {'xt': 4.72, 't': 14.36, 's': 24.10, 'b': 50.45, 'l': 93.74}


@pytest.mark.parametrize('arch', sorted(EXPECTED_PARAMS_M))
def test_parameter_counts_match_the_released_variants(arch):
    model = NaLaFormer(arch=arch, out_indices=(3,))
    # The released backbone has no per-output norms; ours are an addition for dense heads.
    count = sum(p.numel() for n, p in model.named_parameters() if not n.startswith('out_norm'))
    assert count / 1e6 == pytest.approx(EXPECTED_PARAMS_M[arch], rel=5e-3)


def _authors_checkpoint(tmp_path, key='model', prefix=''):
    torch.manual_seed(0)
    authors = AuthorsNaLaFormer(TINY['embed_dims'], TINY['depths'], TINY['num_heads'], 2.0)
    # non-trivial BN statistics and LayerScale so that a missed tensor changes the output
    for module in authors.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    for name, param in authors.named_parameters():
        if name.endswith(('gamma_1', 'gamma_2')):
            param.data.uniform_(0.5, 1.5)
    state = {prefix + k: v for k, v in authors.state_dict().items()}
    path = tmp_path / 'authors.pth'
    torch.save({key: state, 'epoch': 299}, path)
    return authors.eval(), path


@pytest.mark.parametrize('prefix, out_norm', [('', True), ('module.', True), ('', False)])
def test_authors_checkpoint_loads_and_reproduces_stage_features(tmp_path, prefix, out_norm):
    authors, path = _authors_checkpoint(tmp_path, prefix=prefix)
    model = NaLaFormer(arch=TINY, kernel='relu', out_norm=out_norm,
                       init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    model.eval()
    x = torch.randn(2, 3, 61, 77)
    with torch.no_grad():
        ours = model(x)
        theirs = authors.stage_features(x)
    for out, ref in zip(ours, theirs):
        if out_norm:
            ref = F.layer_norm(ref.permute(0, 2, 3, 1), ref.shape[1:2], eps=1e-6).permute(
                0, 3, 1, 2)
        assert rel_err(out, ref) <= 1e-5


def test_ema_weights_are_chosen_on_request(tmp_path):
    authors, _ = _authors_checkpoint(tmp_path)
    state = authors.state_dict()
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
    path = tmp_path / 'with_ema.pth'
    torch.save({'model': state, 'model_ema': ema}, path)
    model = NaLaFormer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path),
                                                use_ema=True))
    model.init_weights()
    assert torch.equal(model.patch_embed.proj[0].weight, ema['patch_embed.proj.0.weight'])


def test_filter_drops_tail_and_rope_buffers():
    authors = AuthorsNaLaFormer(TINY['embed_dims'], TINY['depths'], TINY['num_heads'], 2.0)
    state = filter_authors_checkpoint({'model': authors.state_dict()})
    assert not [k for k in state if k.startswith(('proj.', 'norm.', 'head.')) or 'RoPE' in k]
    assert set(state) == {k for k in NaLaFormer(arch=TINY).state_dict()
                          if not k.startswith('out_norm')}


def test_backbone_of_a_whole_segmentor_checkpoint_loads(tmp_path):
    """A trained segmentor's checkpoint (backbone.* beside decode_head.*) seeds a backbone."""
    source = NaLaFormer(arch=TINY)
    state = {f'backbone.{k}': v for k, v in source.state_dict().items()}
    state['decode_head.conv_seg.weight'] = torch.zeros(6, 64, 1, 1)
    path = tmp_path / 'segmentor.pth'
    torch.save({'state_dict': state, 'meta': {}}, path)
    model = NaLaFormer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_checkpoint_of_another_variant_fails_loudly(tmp_path):
    _, path = _authors_checkpoint(tmp_path)
    other = dict(TINY, embed_dims=(16, 32, 64, 64))
    model = NaLaFormer(arch=other, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(ValueError, match=r'mis-shaped tensors: .*layers\.2') as err:
        model.init_weights()
    assert str(path) in str(err.value)


def test_checkpoint_missing_backbone_keys_fails_listing_them(tmp_path):
    authors, _ = _authors_checkpoint(tmp_path)
    state = {k: v for k, v in authors.state_dict().items() if not k.startswith('layers.3.')}
    path = tmp_path / 'partial.pth'
    torch.save({'model': state}, path)
    model = NaLaFormer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(ValueError, match=r'backbone keys missing .*layers\.3\.blocks\.0'):
        model.init_weights()


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


@pytest.mark.parametrize('out_norm', [True, False])
@pytest.mark.parametrize('frozen_stages', [0, 2])
def test_frozen_stages_stay_frozen_and_in_eval(frozen_stages, out_norm):
    model = NaLaFormer(arch=TINY, frozen_stages=frozen_stages, out_norm=out_norm)
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
    linear = NaLaFormer(arch=TINY, attn_types=('nala',) * 4, kernel='relu')
    assert [type(s.blocks[0].attn) for s in hybrid.layers] == \
        [NormAwareLinearAttention] * 2 + [SoftmaxAttention] * 2
    assert all(isinstance(s.blocks[0].attn, NormAwareLinearAttention) for s in linear.layers)
    assert linear.layers[3].blocks[0].attn.cfg.kernel == 'relu'


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(arch='xxl'), ValueError, "'xxl'"),
    (dict(arch=dict(TINY, depths=(1, 1, 1))), ValueError, r"arch\['depths'\]"),
    (dict(arch=TINY, attn_types=('nala', 'flash', 'nala', 'nala')), ValueError, "'flash'"),
    (dict(arch=TINY, attn_types=('nala',) * 3), ValueError, 'attn_types'),
    (dict(arch=TINY, out_indices=(0, 4)), ValueError, r'\(0, 4\)'),
    (dict(arch=TINY, frozen_stages=5), ValueError, 'frozen_stages.*5'),
    (dict(arch=TINY, out_norm='no'), TypeError, "out_norm.*'no'"),
    (dict(arch=3), TypeError, 'int'),
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
    from mmengine.registry import DefaultScope, MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(dict(type='NaLaFormer', arch='xt', out_indices=(2,)))
    assert isinstance(model, NaLaFormer) and model.embed_dims == ARCH_SETTINGS['xt']['embed_dims']


def test_convert_tool_writes_a_loadable_backbone_checkpoint(tmp_path):
    import subprocess
    import sys
    # the tool verifies against a named variant: write a real-size XT file in the authors' layout
    xt = ARCH_SETTINGS['xt']
    big = AuthorsNaLaFormer(xt['embed_dims'], xt['depths'], xt['num_heads'], xt['mlp_ratios'][0])
    src = tmp_path / 'xt.pth'
    torch.save({'model': big.state_dict(), 'model_ema': big.state_dict()}, src)
    dst = tmp_path / 'xt_backbone.pth'
    proc = subprocess.run([sys.executable, 'tools/convert_checkpoint.py', str(src), str(dst),
                           '--arch', 'xt', '--ema'], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    converted = torch.load(dst, weights_only=True)
    assert set(converted) == {'state_dict', 'meta'} and converted['meta']['ema'] is True
    assert not any(k.startswith(('head.', 'proj.', 'norm.')) for k in converted['state_dict'])
    model = NaLaFormer(arch='xt', init_cfg=dict(type='Pretrained', checkpoint=str(dst)))
    model.init_weights()
    assert torch.equal(model.layers[3].blocks[1].attn.qkvg.weight,
                       big.layers[3].blocks[1].attn.qkvg.weight)
