"""Loading checkpoints into NaLaFormer: the authors' released files (checked against an
independent transcription of the released model), converted and whole-model checkpoints, the
table of the authors' checkpoints, and the refusals and messages when a file does not fit."""
import argparse
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

from nala_mm.models import ARCH_SETTINGS, PRETRAINED, NaLaFormer, checkpoint_filter
from tests.helpers import REPO, LogRecords, rel_err
from tests.helpers import TINY_ARCH as TINY
from tests.reference.released_nalaformer import VARIANTS, ReleasedNaLaFormer, released_variant

RELU = dict(type='NormAwareLinearAttention', kernel='relu')
RELEASED_MIXERS = (RELU, RELU, 'softmax', 'softmax')


def test_the_table_and_the_configs_cover_every_variant():
    from mmengine.config import Config
    listed = Config.fromfile(osp.join(REPO, 'configs', '_base_', 'nala_pretrained.py'))
    assert set(PRETRAINED) == set(ARCH_SETTINGS) == set(VARIANTS) == set(listed.nala_checkpoints)
    assert PRETRAINED['t'].trained_mixers() == RELEASED_MIXERS


def test_every_pretrained_config_fine_tunes_the_released_kernel():
    """Configs that start from the authors' weights run NaLa with the kernel those weights were
    trained with (PRETRAINED), in every NaLa stage."""
    import glob

    from mmengine.config import Config
    configs = sorted(glob.glob(osp.join(REPO, 'configs', '*.py')))
    assert len(configs) == 15
    for path in configs:  # every full-scale config fine-tunes from the authors' weights
        backbone = Config.fromfile(path).model.backbone
        assert backbone.init_cfg['type'] == 'Pretrained', path
        trained = PRETRAINED[backbone.arch].trained_kernel
        nala = [m for m in backbone.mixers
                if m == 'nala' or (isinstance(m, dict) and m['type'] == 'NormAwareLinearAttention')]
        assert nala and all(isinstance(m, dict) and m.get('kernel') == trained for m in nala), path


def released_model(arch, flags: str = 'llvv', seed: int = 0) -> ReleasedNaLaFormer:
    """The independent transcription (tests/reference/released_nalaformer.py): a variant of
    the authors' table by name, or a test's own sizes."""
    torch.manual_seed(seed)
    if isinstance(arch, str):
        model = released_variant(arch, flags)
    else:
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
    mixers = tuple(RELU if f == 'l' else 'softmax' for f in flags)
    model = loaded_backbone(path, arch=arch, mixers=mixers, out_norm_cfg=None)
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
    model = loaded_backbone(str(path), arch=TINY, mixers=RELEASED_MIXERS, out_norm_cfg=None)
    image = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        for out, ref in zip(model(image), reference_outputs(released, image, out_norm=False)):
            assert rel_err(out, ref) <= 1e-5


def test_checkpoint_with_other_rope_frequencies_is_refused(tmp_path):
    released = released_model(TINY)
    common = 1.0 / 10000 ** (torch.arange(4) / 4)  # the usual i/(d/4), not the released formula
    released.layers[0].RoPE.angle.copy_(common.repeat_interleave(2))
    path = save_released(released, tmp_path / 'drifted.pth')
    model = NaLaFormer(arch=TINY, mixers=RELEASED_MIXERS,
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


def test_released_weights_into_cosine_kernel_warn_what_differs(tmp_path):
    path = save_released(released_model(TINY), tmp_path / 'released.pth')
    with LogRecords() as log:
        loaded_backbone(path, arch=TINY)  # 'nala': the paper's cosine kernel
    warnings = log.messages(30)
    assert len(warnings) == 1
    assert "2 NaLa layers here use kernel='cosine'" in warnings[0]
    assert "set kernel='relu'" in warnings[0]
    assert "trained with kernel='relu'" in warnings[0]  # from PRETRAINED, not a literal
    with LogRecords() as log:
        loaded_backbone(path, arch=TINY, mixers=RELEASED_MIXERS)
    assert log.messages(30) == []
    assert any('RoPE frequencies checked for 4 stages' in m for m in log.messages(20))


def test_ema_weights_are_chosen_on_request(tmp_path):
    state = released_model(TINY).state_dict()
    ema = {k: v + 1 if v.is_floating_point() and 'RoPE' not in k else v for k, v in state.items()}
    path = tmp_path / 'with_ema.pth'
    # as their main.py saves it: the command line as a Namespace beside the weights
    torch.save({'model': state, 'model_ema': ema, 'args': argparse.Namespace(epochs=300)}, path)
    model = NaLaFormer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path),
                                                use_ema=True))
    model.init_weights()
    assert torch.equal(model.patch_embed.proj[0].weight, ema['patch_embed.proj.0.weight'])


def test_filter_drops_tail_and_rope_buffers():
    released = released_model(TINY)
    model = NaLaFormer(arch=TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = checkpoint_filter({'model': released.state_dict()}, model)
    assert not [k for k in state if k.startswith(('proj.', 'norm.', 'head.')) or 'RoPE' in k]
    assert set(state) == {k for k in model.state_dict() if not k.startswith('out_norm')}
    # pure: the model is read, not changed
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # a converted file keeps the RoPE frequencies, checked like the rest
    kept = checkpoint_filter(released.state_dict(), model, keep_rope=True)
    assert set(kept) - set(state) == {f'layers.{i}.RoPE.angle' for i in range(4)}


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


def test_convert_tool_writes_a_loadable_backbone_checkpoint(tmp_path):
    import subprocess
    import sys
    # the tool verifies against a named variant: a real-size XT file in the released layout
    released = released_model('xt', flags='llvv')
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
    assert converted['meta']['trained_kernel'] == PRETRAINED['xt'].trained_kernel == 'relu'
    assert 'RoPE frequency buffers' in proc.stdout
    model = NaLaFormer(arch='xt', mixers=PRETRAINED['xt'].trained_mixers(),
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
    the independent transcription at an odd, non-square input size."""
    released = released_model('t', flags)
    path = save_released(released, tmp_path / 'nalaformer_t.pth')
    model = flagship_backbone(config, path)
    assert model.init_cfg['type'] == 'Pretrained'
    model.init_weights()
    model.eval()
    # the configs normalise each output (Swin's convention) and run the released kernel
    assert model.out_norm_cfg == dict(type='LN', eps=1e-6)
    assert [model.layers[i].blocks[0].attn.cfg.kernel for i in (0, 1)] == ['relu', 'relu']
    image = torch.randn(1, 3, 161, 237)  # maps 41x60, 21x30, 11x15, 6x8
    with torch.no_grad():
        ours = model(image)
    for out, ref in zip(ours, reference_outputs(released, image, out_norm=True)):
        assert rel_err(out, ref) <= 1e-4


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
    assert 'tools/convert_checkpoint.py' in message
    assert 'configs/_base_/nala_pretrained.py' in message
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




def test_a_list_init_cfg_runs_its_entries_then_loads_the_pretrained_one(tmp_path):
    """mmengine's list form: the other entries first, the authors' file last, through the
    project's loader (checkpoint tensors win; the dense-only output norms keep the entry's)."""
    state = released_model(TINY).state_dict()
    path = tmp_path / 'authors.pth'
    torch.save({'model': state}, path)
    model = NaLaFormer(arch=TINY, mixers=RELEASED_MIXERS, init_cfg=[
        dict(type='Constant', layer='LayerNorm', val=0.5, bias=0.25),
        dict(type='Pretrained', checkpoint=str(path))])
    model.init_weights()
    assert torch.equal(model.layers[0].blocks[0].norm1.norm.weight,
                       state['layers.0.blocks.0.norm1.norm.weight'])
    new = model.out_norm0.norm
    assert torch.equal(new.weight, torch.full_like(new.weight, 0.5))
    assert torch.equal(new.bias, torch.full_like(new.bias, 0.25))
    assert isinstance(model.init_cfg, list)  # left as given

    twice = NaLaFormer(arch=TINY, init_cfg=[dict(type='Pretrained', checkpoint='a.pth'),
                                            dict(type='Pretrained', checkpoint='b.pth')])
    with pytest.raises(ValueError, match=r"2 Pretrained entries \(\['a.pth', 'b.pth'\]\)"):
        twice.init_weights()
