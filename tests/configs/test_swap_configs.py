"""The configs that swap NaLa into mmseg's/mmdet's stock backbones (configs/swap/): each builds
in its scope, changes only what it says, and trains one iteration on the embedded demo data."""
import glob
import os.path as osp
from typing import NamedTuple, Optional

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

from nala_mm.models import DEFAULT_HYBRID
from nala_mm.models.swap import (
    DetNaLaSwinTransformer,
    NaLaMixVisionTransformer,
    NaLaPyramidVisionTransformerV2,
    NaLaVisionTransformer,
    SegNaLaSwinTransformer,
)
from tests.helpers import REPO

SWAP = REPO / 'configs' / 'swap'


class Swap(NamedTuple):
    cls: type
    mixers: tuple
    stock: str  # the stock config it inherits, to check that nothing else changed
    mixer_ln_decay: bool = True  # the recipe decays weights: the mixers' LayerNorm must not
    test_cfg: Optional[dict] = None  # a changed test mode


EXPECTED = {
    'ade20k_swin-t_upernet_nala-s12.py': Swap(
        SegNaLaSwinTransformer, DEFAULT_HYBRID,
        'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'),
    'ade20k_swin-t_upernet_nala-all.py': Swap(
        SegNaLaSwinTransformer, ('nala',) * 4,
        'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'),
    'ade20k_segformer_mit-b0_nala-s12.py': Swap(
        NaLaMixVisionTransformer, DEFAULT_HYBRID,
        'mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py'),
    'coco_swin-t_mask-rcnn_1x_nala-s12.py': Swap(
        DetNaLaSwinTransformer, DEFAULT_HYBRID,
        'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'),
    'coco_pvtv2-b0_retinanet_1x_nala-s12.py': Swap(
        NaLaPyramidVisionTransformerV2, DEFAULT_HYBRID,
        'mmdet::pvt/retinanet_pvtv2-b0_fpn_1x_coco.py'),
    'ade20k_deit-s_upernet_nala-all.py': Swap(
        NaLaVisionTransformer, ('nala',) * 12,
        'mmseg::vit/vit_deit-s16_upernet_8xb2-160k_ade20k-512x512.py'),
    # no weight decay in either recipe: the mixers' parameters need nothing more
    'ade20k_segmenter_vit-s_mask_nala-all.py': Swap(
        NaLaVisionTransformer, ('nala',) * 12,
        'mmseg::segmenter/segmenter_vit-s_mask_8xb1-160k_ade20k-512x512.py', False),
    'cityscapes_setr_vit-l_naive_nala-all.py': Swap(
        NaLaVisionTransformer, ('nala',) * 24,
        'mmseg::setr/setr_vit-l_naive_8xb1-80k_cityscapes-768x768.py', False,
        dict(mode='whole')),
}
# what a config calls each class (the two Swin classes share their registered name)
TYPE_NAMES = {SegNaLaSwinTransformer: 'NaLaSwinTransformer',
              DetNaLaSwinTransformer: 'NaLaSwinTransformer'}


def stock_config(spec: str) -> Config:
    """``'mmseg::path'`` -> the installed package's config."""
    package, path = spec.split('::')
    root = osp.dirname(__import__(package).__file__)
    return Config.fromfile(osp.join(root, '.mim', 'configs', path))


def unscoped(value):
    """A config value without the ``_scope_`` keys mmengine adds on ``pkg::`` inheritance."""
    if isinstance(value, dict):
        return {k: unscoped(v) for k, v in value.items() if k != '_scope_'}
    if isinstance(value, (list, tuple)):
        return type(value)(unscoped(v) for v in value)
    return value


def test_every_config_is_listed():
    """ViTDet has no stock mmdet config to differ from: test_vitdet_configs.py checks it."""
    names = [osp.basename(p) for p in glob.glob(str(SWAP / '*.py'))]
    assert sorted(n for n in names if '_vitdet-' not in n) == sorted(EXPECTED)


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_only_the_backbone_type_mixers_and_the_mixer_norm_decay_change(name):
    swap = EXPECTED[name]
    ours = unscoped(Config.fromfile(str(SWAP / name)).to_dict())
    stock = unscoped(stock_config(swap.stock).to_dict())
    ours_backbone, stock_backbone = ours['model'].pop('backbone'), stock['model'].pop('backbone')
    assert ours_backbone.pop('type') == TYPE_NAMES.get(swap.cls, swap.cls.__name__)
    assert tuple(ours_backbone.pop('mixers')) == swap.mixers
    stock_backbone.pop('type')
    assert ours_backbone == stock_backbone
    if swap.test_cfg is not None:
        assert ours['model'].pop('test_cfg') == swap.test_cfg
        stock['model'].pop('test_cfg')
    assert ours['model'] == stock['model']
    if swap.mixer_ln_decay:
        keys = ours['optim_wrapper'].pop('paramwise_cfg')['custom_keys']
        assert keys.pop('mixer.ln') == dict(decay_mult=0.)
        stock_paramwise = stock['optim_wrapper'].pop('paramwise_cfg', {})
        assert keys == stock_paramwise.get('custom_keys', {})
    assert ours['optim_wrapper'] == stock['optim_wrapper']
    for key in ('train_dataloader', 'param_scheduler', 'train_cfg', 'val_evaluator'):
        assert ours[key] == stock[key], key


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_optimizer_groups_of_the_mixers(name):
    """No decay on the mixers' LayerNorm; no stock key (SegFormer's 'head' lr x10) catches a
    backbone parameter by accident."""
    cfg = Config.fromfile(str(SWAP / name))
    init_default_scope(cfg.default_scope)
    registry = __import__(f'{cfg.default_scope}.registry', fromlist=['MODELS']).MODELS
    if 'pretrained' in cfg.model:
        cfg.model.pretrained = None  # (a stock Segmenter names a download URL)
    model = registry.build(cfg.model)
    assert type(model.backbone) is EXPECTED[name].cls
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {names[id(p)]: group for group in wrapper.optimizer.param_groups
              for p in group['params']}
    base_lr = cfg.optim_wrapper.optimizer.lr
    mixer_params = [n for n in groups if '.mixer.' in n]
    assert mixer_params
    decays = cfg.optim_wrapper.optimizer.get('weight_decay', 0) > 0
    assert decays == EXPECTED[name].mixer_ln_decay
    for param in mixer_params:
        assert groups[param]['lr'] == base_lr, param
        assert (groups[param]['weight_decay'] == 0) == ('.mixer.ln.' in param or not decays), \
            param
    assert all(groups[n]['lr'] == base_lr for n in groups if n.startswith('backbone.'))


def _one_iteration_config(name: str, roots: dict, work_dir) -> Config:
    cfg = Config.fromfile(str(SWAP / name))
    cfg.work_dir = str(work_dir)
    cfg.model.backbone.init_cfg = None  # the stock configs point at download URLs
    if 'pretrained' in cfg.model:
        cfg.model.pretrained = None
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=1, val_interval=1000)
    # two images: UperNet's pyramid pooling normalises a 1x1 map over the batch
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.param_scheduler = []
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    cfg.default_hooks.checkpoint = None
    cfg.log_level = 'WARNING'
    dataset = cfg.train_dataloader.dataset
    if cfg.default_scope == 'mmseg':
        dataset.data_root = str(roots[dataset.type])
        cfg.model.data_preprocessor.size = (96, 96)
        for step in dataset.pipeline:
            if step.type == 'RandomResize':
                step.scale = (192, 96)
            if step.type == 'RandomCrop':
                step.crop_size = (96, 96)
    else:
        dataset.data_root = f'{roots["coco"]}/'
        # the demo's four classes take COCO's first four label ids; the heads keep their 80
        dataset.metainfo = dict(classes=('disc', 'square', 'triangle', 'star'))
        for step in dataset.pipeline:
            if step.type == 'Resize':
                step.scale = (128, 128)
    return cfg


# The Swin-T ones (a 28M-parameter backbone under UperNet / Mask R-CNN) and SETR's ViT-L (300M)
# run under make test-extended; the others in make test.
@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.extended)
                                  if 'swin-t' in n or 'vit-l' in n else n
                                  for n in sorted(EXPECTED)])
def test_one_training_iteration_on_generated_data(name, tiny_ade, tiny_coco, tiny_cityscapes,
                                                  tmp_path):
    roots = dict(ADE20KDataset=tiny_ade, CityscapesDataset=tiny_cityscapes, coco=tiny_coco)
    runner = Runner.from_cfg(_one_iteration_config(name, roots, tmp_path))
    before = {n: p.detach().clone() for n, p in runner.model.named_parameters()
              if '.mixer.' in n}
    runner.train()
    loss = runner.message_hub.get_scalar('train/loss').current()
    assert torch.isfinite(torch.tensor(loss)) and loss > 0
    after = dict(runner.model.named_parameters())
    assert all(not torch.equal(after[n], value) for n, value in before.items()
               if n.endswith('qkvg.weight'))  # the step reached the swapped stages
