"""Every config builds its model in its scope, wired to the backbone's channels; the recipes'
settings; weight decay by parameter type."""
import copy
import functools
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from tests.helpers import REPO

REPO = str(REPO)


@functools.lru_cache(maxsize=None)
def _parsed(path: str) -> Config:
    return Config.fromfile(path)


def load(path: str) -> Config:
    """A config, parsed once per session (``mmseg::``/``mmdet::`` inheritance is slow)."""
    return copy.deepcopy(_parsed(path))


def build_on_meta(cfg: Config):
    """The config's model with its tensors on the meta device: the wiring, without the memory
    and time of full-size weights."""
    init_default_scope(cfg.default_scope)
    registry = __import__(f'{cfg.default_scope}.registry', fromlist=['MODELS']).MODELS
    with torch.device('meta'):
        return registry.build(cfg.model)


# the long-range task's plain ViT (the linearize study's teacher) and its NaLa swap


def nalaformer_configs(pattern: str) -> list:
    """The NaLaFormer configs matching ``pattern``; configs/swap/ (stock backbones with NaLa
    swapped in) has its own checks in tests/configs/test_swap_configs.py."""
    return sorted(p for p in glob.glob(osp.join(REPO, 'configs', '**', pattern), recursive=True)
                  if '/swap/' not in p)


SEG_CONFIGS = nalaformer_configs('ade20k_*.py')


@pytest.mark.parametrize('path', SEG_CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_every_segmentation_config_builds_its_model(path):
    cfg = load(path)
    assert cfg.custom_imports['imports'] == ['nala_mm']
    backbone = build_on_meta(cfg).backbone
    # the first module after the backbone is wired to the variant's channels
    first = cfg.model.neck if 'neck' in cfg.model else cfg.model.decode_head
    # the stages the backbone returns (the long-range task decodes stage 1 alone)
    assert list(first.in_channels) == [backbone.embed_dims[i] for i in backbone.out_indices]
    if cfg.model.get('auxiliary_head') is not None:
        assert cfg.model.auxiliary_head.in_channels == backbone.embed_dims[2]


def test_main_config_follows_the_recipe():
    cfg = load(osp.join(REPO, 'configs', 'ade20k_nala_upernet.py'))
    assert cfg.model.backbone.arch == 't'
    assert cfg.train_cfg.max_iters == 160000
    assert cfg.train_dataloader.batch_size == 2  # x 8 GPUs = 16 images per iteration
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999),
                                               weight_decay=0.01)
    warmup, poly = cfg.param_scheduler
    assert (warmup.type, warmup.end, poly.type, poly.power) == ('LinearLR', 1500, 'PolyLR', 1.0)
    assert cfg.model.auxiliary_head.in_index == 2
    assert cfg.train_dataloader.dataset.data_root == 'data/ade/ADEChallengeData2016'


def test_no_weight_decay_on_norms_layerscale_and_attention_ln():
    cfg = load(osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py'))
    init_default_scope('mmseg')
    from mmengine.optim import build_optim_wrapper
    from mmseg.registry import MODELS
    model = MODELS.build(cfg.model)
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)]: group['weight_decay'] for group in wrapper.optimizer.param_groups
             for p in group['params']}
    assert sorted(decay) == sorted(names.values())  # every parameter is in the optimizer once
    assert decay['backbone.layers.0.blocks.0.gamma_1'] == 0
    assert decay['backbone.layers.0.blocks.0.gamma_2'] == 0
    assert decay['backbone.layers.0.blocks.0.norm1.norm.weight'] == 0
    assert decay['backbone.layers.0.blocks.0.attn.ln.weight'] == 0
    assert decay['backbone.out_norm3.norm.weight'] == 0
    # the stem's and the downsamples' BatchNorms (no 'norm' in the stem's names)
    for index in (1, 4, 7, 10):
        assert decay[f'backbone.patch_embed.proj.{index}.weight'] == 0, index
        assert decay[f'backbone.patch_embed.proj.{index}.bias'] == 0, index
    assert decay['backbone.layers.0.downsample.norm.weight'] == 0
    assert decay['backbone.layers.0.blocks.0.attn.qkvg.weight'] == pytest.approx(0.01)

    # by type, everywhere: every norm layer's parameters are free of decay; every conv and
    # linear weight (and LayerScale aside, every other parameter) keeps the configured 0.01
    norm_types = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
                  torch.nn.modules.instancenorm._InstanceNorm)
    in_norms = {f'{module_name}.{name}' for module_name, module in model.named_modules()
                if isinstance(module, norm_types)
                for name, _ in module.named_parameters(recurse=False)}
    weights = {f'{module_name}.weight' for module_name, module in model.named_modules()
               if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear))}
    stem_bn = {n for n in in_norms if n.startswith('backbone.patch_embed.')}
    assert len(stem_bn) == 8 and len(in_norms) > 40 and len(weights) > 20
    assert not in_norms & weights
    for name, value in decay.items():
        if name in in_norms or name.endswith(('.gamma_1', '.gamma_2')):
            assert value == 0, name
        else:
            assert value == pytest.approx(0.01), name
    assert weights <= set(decay)


DET_CONFIGS = nalaformer_configs('coco_*.py')


@pytest.mark.parametrize('path', DET_CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_every_detection_config_builds_its_model(path):
    cfg = load(path)
    assert cfg.custom_imports['imports'] == ['nala_mm']
    model = build_on_meta(cfg)
    dims = model.backbone.embed_dims
    assert list(cfg.model.neck.in_channels) == [dims[i] for i in model.backbone.out_indices]


def test_detection_recipes():
    one = load(osp.join(REPO, 'configs', 'coco_nala_mask-rcnn_1x.py'))
    three = load(osp.join(REPO, 'configs', 'coco_nala_mask-rcnn_3x.py'))
    assert one.train_cfg.max_epochs == 12 and one.param_scheduler[1].milestones == [8, 11]
    optimizer = one.optim_wrapper.optimizer
    assert optimizer.lr == 1e-4 and optimizer.weight_decay == 0.05
    assert three.train_cfg.max_epochs == 36 and three.param_scheduler[1].milestones == [27, 33]
    scales = three.train_dataloader.dataset.pipeline[2].scales
    assert min(s[1] for s in scales) == 480 and max(s[1] for s in scales) == 800
    linear = load(osp.join(REPO, 'configs', 'coco_nala-t-linear_mask-rcnn_1x.py'))
    assert [(m['type'], m['kernel']) for m in linear.model.backbone.mixers] == [
        ('NormAwareLinearAttention', 'relu')] * 4


def test_detection_configs_carry_a_flip_tta():
    for name in ('coco_nala_mask-rcnn_1x.py', 'coco_nala_retinanet_1x.py'):
        cfg = load(osp.join(REPO, 'configs', name))
        assert cfg.tta_model.type == 'DetTTAModel'
        flips = cfg.tta_pipeline[1].transforms[1]
        assert sorted(t['prob'] for t in flips) == [0.0, 1.0], name
    demo = load(osp.join(REPO, 'configs', 'demo', 'coco_demo_nala_mask-rcnn.py'))
    assert demo.tta_pipeline[1].transforms[0][0].scale == demo.image_scale
