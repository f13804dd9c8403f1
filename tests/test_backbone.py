"""NaLaFormer backbone: shapes, authors' checkpoints, parameter counts, training controls."""
import math
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

from nala_mm.models import ARCH_SETTINGS, NaLaFormer, filter_authors_checkpoint
from tests.released_nalaformer import RoPE, ReleasedNaLaFormer, released_frequencies

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
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
            norm = getattr(normed, f'out_norm{i}')  # over channels: tokens (B, H, W, C)
            expected = norm(without.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            assert torch.allclose(with_norm, expected, atol=1e-6)
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


def released_model(arch: dict, flags: str = 'llvv', seed: int = 0) -> ReleasedNaLaFormer:
    """The independent transcription (tests/released_nalaformer.py) at ``arch``'s sizes."""
    torch.manual_seed(seed)
    model = ReleasedNaLaFormer(arch['embed_dims'], arch['depths'], arch['num_heads'],
                               arch['mlp_ratios'][0], flags=flags,
                               layer_scales=arch.get('layer_scale_init_values', (1.0,) * 4))
    return model.randomise_statistics(seed).eval()


def save_released(model: ReleasedNaLaFormer, path, key: str = 'model', prefix: str = '',
                  **extra) -> str:
    state = {prefix + k: v for k, v in model.state_dict().items()}
    torch.save({key: state, 'epoch': 299, **extra}, path)
    return str(path)


def reference_outputs(released: ReleasedNaLaFormer, image, out_norm: bool, indices=(0, 1, 2, 3)):
    with torch.no_grad():
        features = released.stage_features(image)
    outs = []
    for i in indices:
        ref = features[i]
        if out_norm:  # a fresh out_norm{i}: LayerNorm over channels, unit weight, zero bias
            ref = F.layer_norm(ref.permute(0, 2, 3, 1), ref.shape[1:2], eps=1e-6).permute(
                0, 3, 1, 2)
        outs.append(ref)
    return outs


def loaded_backbone(path: str, **kwargs) -> NaLaFormer:
    model = NaLaFormer(init_cfg=dict(type='Pretrained', checkpoint=path), **kwargs)
    model.init_weights()
    return model.eval()


# head dim 4 in stage 1 (d/4 = 1: a single RoPE frequency) and 12 in stage 3
TINY_D4 = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(4, 2, 4, 4),
               mlp_ratios=(2, 2, 2, 2))


@pytest.mark.parametrize('arch, flags', [(TINY, 'llvv'), (TINY, 'llll'), (TINY_D4, 'llvv')],
                         ids=['tiny-hybrid', 'tiny-all-linear', 'head-dim-4-hybrid'])
@pytest.mark.parametrize('size', [(64, 64), (61, 77)], ids=['square', 'odd'])
def test_released_checkpoint_reproduces_the_released_stage_features(tmp_path, arch, flags, size):
    released = released_model(arch, flags)
    path = save_released(released, tmp_path / 'released.pth')
    attn_types = tuple('nala' if f == 'l' else 'softmax' for f in flags)
    model = loaded_backbone(path, arch=arch, attn_types=attn_types, kernel='relu', out_norm=False)
    image = torch.randn(2, 3, *size)
    with torch.no_grad():
        ours = model(image)
    for out, ref in zip(ours, reference_outputs(released, image, out_norm=False)):
        assert rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize('prefix', ['module.', 'backbone.', 'module.backbone.'])
def test_wrapped_checkpoints_load_their_backbone(tmp_path, prefix):
    """DDP (module.), whole segmentor/detector (backbone.) and both, heads left out."""
    released = released_model(TINY)
    state = {prefix + k: v for k, v in released.state_dict().items()}
    if 'backbone' in prefix:
        state[prefix.replace('backbone.', 'decode_head.') + 'conv_seg.weight'] = torch.zeros(6, 64,
                                                                                           1, 1)
    path = tmp_path / 'wrapped.pth'
    torch.save({'state_dict': state, 'meta': {}}, path)
    model = loaded_backbone(str(path), arch=TINY, kernel='relu', out_norm=False)
    image = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        for out, ref in zip(model(image), reference_outputs(released, image, out_norm=False)):
            assert rel_err(out, ref) <= 1e-5


def test_checkpoint_with_other_rope_frequencies_is_refused(tmp_path):
    released = released_model(TINY)
    common = 1.0 / 10000 ** (torch.arange(4) / 4)  # the usual i/(d/4), not the released formula
    released.layers[0].RoPE.angle.copy_(common.repeat_interleave(2))
    path = save_released(released, tmp_path / 'drifted.pth')
    model = NaLaFormer(arch=TINY, kernel='relu',
                       init_cfg=dict(type='Pretrained', checkpoint=path))
    before = model.layers[0].blocks[0].attn.qkvg.weight.clone()
    with pytest.raises(ValueError, match=r'RoPE frequencies stored for stage 0 \(layers\.0\.RoPE'
                                         r'\.angle\) differ .* by up to 9') as err:
        model.init_weights()
    assert 'drifted.pth' in str(err.value)
    assert torch.equal(model.layers[0].blocks[0].attn.qkvg.weight, before)  # nothing loaded


def test_checkpoint_rope_of_another_head_dim_is_refused(tmp_path):
    released = released_model(TINY)
    path = save_released(released, tmp_path / 'released.pth')
    other = dict(TINY, num_heads=(2, 2, 4, 4))  # stage 1 head dim 8 instead of 16
    model = NaLaFormer(arch=other, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(ValueError, match=r'layers\.0\.RoPE\.angle has shape \(8,\).*\(4,\)'):
        model.init_weights()


class LogRecords:
    """Collects what mmengine's current logger emits (it does not propagate to pytest)."""

    def __enter__(self):
        import logging
        from mmengine.logging import MMLogger
        self.records, self.logger = [], MMLogger.get_current_instance()
        self.handler = logging.Handler()
        self.handler.emit = self.records.append
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)

    def messages(self, level: int):
        return [r.getMessage() for r in self.records if r.levelno == level]


def test_released_weights_into_cosine_kernel_warn_what_differs(tmp_path):
    path = save_released(released_model(TINY), tmp_path / 'released.pth')
    with LogRecords() as log:
        loaded_backbone(path, arch=TINY, kernel='cosine')
    warnings = log.messages(30)
    assert len(warnings) == 1
    assert "2 NaLa layers here use kernel='cosine'" in warnings[0]
    assert "set kernel='relu'" in warnings[0]
    with LogRecords() as log:
        loaded_backbone(path, arch=TINY, kernel='relu')
    assert log.messages(30) == []
    assert any('RoPE frequencies checked for 4 stages' in m for m in log.messages(20))


def test_ema_weights_are_chosen_on_request(tmp_path):
    state = released_model(TINY).state_dict()
    ema = {k: v + 1 if v.is_floating_point() and 'RoPE' not in k else v for k, v in state.items()}
    path = tmp_path / 'with_ema.pth'
    torch.save({'model': state, 'model_ema': ema}, path)
    model = NaLaFormer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path),
                                                use_ema=True))
    model.init_weights()
    assert torch.equal(model.patch_embed.proj[0].weight, ema['patch_embed.proj.0.weight'])


def test_filter_drops_tail_and_rope_buffers():
    released = released_model(TINY)
    state = filter_authors_checkpoint({'model': released.state_dict()})
    assert not [k for k in state if k.startswith(('proj.', 'norm.', 'head.')) or 'RoPE' in k]
    assert set(state) == {k for k in NaLaFormer(arch=TINY).state_dict()
                          if not k.startswith('out_norm')}


def test_checkpoint_of_another_variant_fails_loudly(tmp_path):
    path = save_released(released_model(TINY), tmp_path / 'released.pth')
    other = dict(TINY, embed_dims=(16, 32, 64, 64))
    model = NaLaFormer(arch=other, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(ValueError, match=r'mis-shaped tensors: .*layers\.2') as err:
        model.init_weights()
    assert path in str(err.value)


def test_checkpoint_missing_backbone_keys_fails_listing_them(tmp_path):
    state = {k: v for k, v in released_model(TINY).state_dict().items()
             if not k.startswith('layers.3.')}
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
    from mmengine.registry import DefaultScope, MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(dict(type='NaLaFormer', arch='xt', out_indices=(2,)))
    assert isinstance(model, NaLaFormer) and model.embed_dims == ARCH_SETTINGS['xt']['embed_dims']


def test_convert_tool_writes_a_loadable_backbone_checkpoint(tmp_path):
    import subprocess
    import sys
    # the tool verifies against a named variant: a real-size XT file in the released layout
    xt = ARCH_SETTINGS['xt']
    released = released_model(xt, flags='llvv')
    model_state = released.state_dict()
    # EMA weights that differ from the plain ones, so picking the wrong entry is visible
    ema_state = {k: v + 0.5 if v.is_floating_point() and 'RoPE' not in k else v
                 for k, v in model_state.items()}
    src = tmp_path / 'xt.pth'
    torch.save({'model': model_state, 'model_ema': ema_state}, src)
    dst = tmp_path / 'xt_backbone.pth'
    proc = subprocess.run([sys.executable, 'tools/convert_checkpoint.py', str(src), str(dst),
                           '--arch', 'xt', '--ema'], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    converted = torch.load(dst, weights_only=True)
    assert set(converted) == {'state_dict', 'meta'} and converted['meta']['ema'] is True
    assert not any(k.startswith(('head.', 'proj.', 'norm.')) for k in converted['state_dict'])
    # the RoPE frequencies travel along, so loading the converted file checks them too
    assert torch.equal(converted['state_dict']['layers.3.RoPE.angle'],
                       model_state['layers.3.RoPE.angle'])
    model = NaLaFormer(arch='xt', kernel='relu',
                       init_cfg=dict(type='Pretrained', checkpoint=str(dst)))
    model.init_weights()
    key = 'layers.3.blocks.1.attn.qkvg.weight'
    assert torch.equal(model.state_dict()[key], ema_state[key])
    assert not torch.equal(model.state_dict()[key], model_state[key])


FLAGSHIPS = [('ade20k_nala_upernet.py', 'llvv'), ('coco_nala_mask-rcnn_1x.py', 'llvv'),
             ('ade20k_nala-t-linear_upernet.py', 'llll')]


def flagship_backbone(config: str, checkpoint: str = None) -> NaLaFormer:
    """The backbone exactly as a full-scale config defines it (SyncBN run as BN in one process),
    with its checkpoint path replaced when given."""
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS
    cfg = Config.fromfile(osp.join(REPO, 'configs', config)).model.backbone
    if checkpoint is not None:
        cfg.init_cfg.checkpoint = checkpoint
    return revert_sync_batchnorm(MODELS.build(cfg))


@pytest.mark.parametrize('config, flags', FLAGSHIPS, ids=[c for c, _ in FLAGSHIPS])
def test_flagship_configs_reproduce_the_released_model(tmp_path, config, flags):
    """NaLaFormer-T built by the full-scale configs from a released-layout T checkpoint equals
    the independent transcription at 224^2 and at an odd, non-square size."""
    released = released_model(ARCH_SETTINGS['t'], flags)
    path = save_released(released, tmp_path / 'nalaformer_t.pth')
    model = flagship_backbone(config, path)
    assert model.init_cfg['type'] == 'Pretrained'
    model.init_weights()
    model.eval()
    assert model.out_norm  # the configs normalise each output (Swin's convention)
    for size in ((224, 224), (161, 237)):
        image = torch.randn(1, 3, *size)
        with torch.no_grad():
            ours = model(image)
        for out, ref in zip(ours, reference_outputs(released, image, out_norm=True)):
            assert rel_err(out, ref) <= 1e-4, size


@pytest.mark.parametrize('config', ['ade20k_nala_upernet.py', 'coco_nala_mask-rcnn_1x.py'])
def test_missing_pretrained_checkpoint_says_where_and_how_to_train_from_scratch(config):
    from mmengine.config import Config, DictAction
    model = flagship_backbone(config)
    expected = Config.fromfile(osp.join(REPO, 'configs', '_base_', 'nala_pretrained.py'))
    assert model.init_cfg['checkpoint'] == expected.nala_checkpoints['t']
    with pytest.raises(FileNotFoundError) as err:
        model.init_weights()
    message = str(err.value)
    assert "'checkpoints/nalaformer_t.pth'" in message and 'NaLaFormer-T' in message
    assert 'tools/convert_checkpoint.py' in message and 'configs/_base_/nala_pretrained.py' in message
    scratch = message.split('--cfg-options ')[-1].split()
    # detection freezes the stem and keeps BN statistics: meaningless from random weights
    if config.startswith('coco'):
        assert scratch == ['model.backbone.init_cfg=None', 'model.backbone.frozen_stages=-1',
                           'model.backbone.norm_eval=False']
    else:
        assert scratch == ['model.backbone.init_cfg=None']
    # the printed options really train from scratch: parse them as tools/train.py does
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    options = parser.parse_args(['--cfg-options', *scratch]).cfg_options
    cfg = Config.fromfile(osp.join(REPO, 'configs', config))
    cfg.merge_from_dict(options)
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS
    scratch_model = revert_sync_batchnorm(MODELS.build(cfg.model.backbone))
    scratch_model.init_weights()  # no file needed
    scratch_model.train()
    assert all(p.requires_grad for p in scratch_model.parameters())
    assert all(m.training for m in scratch_model.modules())


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
