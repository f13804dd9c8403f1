"""The two ViTDet-B configs (configs/swap/coco_vitdet-b_*): ViTDet's recipe as the configs state
it, one training iteration at 128 x 128 on the generated COCO data, and a stock mmseg-layout
ViT-B checkpoint through ``init_cfg`` with its carried / dropped / new log; under mmdet's own
train.py in make test-extended."""
import os.path as osp
import re

import mmdet
import pytest
import torch
from mmdet.registry import MODELS as DET_MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from mmseg.models.backbones import VisionTransformer

from nala_mm.models import SimpleFPN
from nala_mm.models.swap import NaLaVisionTransformer
from tests.helpers import REPO, run_tool, vitdet_tiny_data

SWAP = REPO / 'configs' / 'swap'
STOCK = 'coco_vitdet-b_mask-rcnn_lsj-100e.py'
NALA = 'coco_vitdet-b_mask-rcnn_lsj-100e_nala-all.py'
# ViTDet-B: windows in blocks 0, 1, 3, 4, 6, 7, 9, 10, global (SDPA) in 2, 5, 8, 11
LAYOUTS = {STOCK: ['window', 'window', 'sdpa'] * 4, NALA: ['nala'] * 12}


@pytest.mark.parametrize('name', sorted(LAYOUTS))
def test_the_config_states_vitdets_recipe(name):
    cfg = Config.fromfile(str(SWAP / name))
    backbone = cfg.model.backbone
    assert backbone.type == 'NaLaVisionTransformer' and list(backbone.mixers) == LAYOUTS[name]
    assert (backbone.embed_dims, backbone.num_layers, backbone.num_heads) == (768, 12, 12)
    assert backbone.with_cls_token is False and backbone.out_indices == (11,)
    assert backbone.drop_path_rate == 0.1 and tuple(backbone.img_size) == (1024, 1024)
    assert cfg.model.neck.type == 'SimpleFPN' and cfg.model.neck.num_outs == 5
    assert cfg.model.rpn_head.num_convs == 2
    assert cfg.model.roi_head.bbox_head.type == 'Shared4Conv1FCBBoxHead'
    assert cfg.model.roi_head.bbox_head.norm_cfg == dict(type='LN2d')
    optim = cfg.optim_wrapper
    assert optim.type == 'OptimWrapper' and optim.constructor == \
        'ViTLayerDecayOptimWrapperConstructor' and optim.paramwise_cfg.decay_rate == 0.7
    assert (optim.optimizer.type, optim.optimizer.lr, optim.optimizer.weight_decay) == \
        ('AdamW', 1e-4, 0.1)
    assert cfg.train_cfg.max_iters == 184375
    warmup, steps = cfg.param_scheduler
    assert warmup.end == 250 and steps.milestones == [163889, 177546]
    assert cfg.auto_scale_lr.base_batch_size == 64 and cfg.train_dataloader.batch_size == 2
    pad = cfg.model.data_preprocessor.batch_augments[0]
    assert pad.type == 'BatchFixedSizePad' and tuple(pad.size) == (1024, 1024)


def _at_128(name: str, root, work_dir) -> Config:
    cfg = Config.fromfile(str(SWAP / name))
    cfg.work_dir = str(work_dir)
    side = (128, 128)
    cfg.model.backbone.update(img_size=side, init_cfg=None)
    cfg.model.data_preprocessor.batch_augments[0].size = side
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=1, val_interval=1000)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.param_scheduler = []
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    cfg.default_hooks.checkpoint = None
    cfg.log_level = 'WARNING'
    dataset = cfg.train_dataloader.dataset.dataset  # inside LSJ's RepeatDataset
    dataset.data_root = f'{root}/'
    dataset.metainfo = dict(classes=('disc', 'square', 'triangle', 'star'))
    for step in dataset.pipeline:
        if step.type == 'RandomResize':
            step.scale = side
        if step.type == 'RandomCrop':
            step.crop_size = side
    return cfg


@pytest.mark.parametrize('name', sorted(LAYOUTS))
def test_one_training_iteration_at_128(name, tiny_coco, tmp_path):
    runner = Runner.from_cfg(_at_128(name, tiny_coco, tmp_path))
    model = runner.model
    assert type(model.backbone) is NaLaVisionTransformer and type(model.neck) is SimpleFPN
    before = {n: p.detach().clone() for n, p in model.named_parameters() if '.mixer.' in n}
    runner.train()
    loss = runner.message_hub.get_scalar('train/loss').current()
    assert torch.isfinite(torch.tensor(loss)) and loss > 0
    after = dict(model.named_parameters())
    moved = [n for n, value in before.items() if not torch.equal(after[n], value)]
    assert any('layers.0.' in n for n in moved) and any('layers.11.' in n for n in moved)
    # layer decay reached the optimizer: layer 1's rate is 0.7 ** 12 of the neck's
    rates = {g['layer_id']: g['lr'] for g in runner.optim_wrapper.optimizer.param_groups}
    assert rates[1] == pytest.approx(rates[13] * 0.7 ** 12)


@pytest.mark.parametrize('name', sorted(LAYOUTS))
def test_a_stock_mmseg_vit_b_loads_through_init_cfg(name, tmp_path):
    """vit2mmseg's output layout at 224 (a 14 x 14 position table), into the 1024 model."""
    stock = VisionTransformer(img_size=224, patch_size=16, embed_dims=768, num_layers=12,
                              num_heads=12, patch_bias=True, final_norm=True,
                              norm_cfg=dict(type='LN', eps=1e-6))
    path = tmp_path / 'vit-b.pth'
    torch.save(stock.state_dict(), path)
    cfg = Config.fromfile(str(SWAP / name)).model.backbone
    cfg.init_cfg.checkpoint = str(path)
    init_default_scope('mmdet')
    backbone = DET_MODELS.build(cfg)
    backbone.init_weights()
    report = backbone.carry_over_report
    lines = report.lines(backbone.swapped_names, 'layer')
    assert len(lines) == 12
    if name == STOCK:
        assert all("carried ['attn.in_proj_weight -> mixer.qkv.weight'" in line
                   and 'dropped []; new []' in line for line in lines)
        assert torch.equal(backbone.layers[5].attn.mixer.qkv.weight,
                           stock.layers[5].attn.attn.in_proj_weight)
    else:
        assert all("'attn.in_proj_weight -> mixer.qkvg.weight[:2304]'" in line
                   and "new ['mixer.qkvg.weight[2304:]'" in line for line in lines)
        assert torch.equal(backbone.layers[5].attn.mixer.qkvg.weight[:2304],
                           stock.layers[5].attn.attn.in_proj_weight)
    assert torch.equal(backbone.patch_embed.projection.bias, stock.patch_embed.projection.bias)
    assert backbone.pos_embed.shape == (1, 64 * 64 + 1, 768)  # resized from 14 x 14


UNDER_MMDET = """_base_ = [{base!r}]
side = (128, 128)
model = dict(
    data_preprocessor=dict(batch_augments=[dict(type='BatchFixedSizePad', size=side,
                                                pad_mask=True)]),
    backbone=dict(img_size=side, init_cfg=None))
{data}train_cfg = dict(max_iters=1, val_interval=1000)
param_scheduler = []
val_cfg = val_dataloader = val_evaluator = None
test_cfg = test_dataloader = test_evaluator = None
default_hooks = dict(checkpoint=dict(interval=1), logger=dict(interval=1))
"""


@pytest.mark.extended
@pytest.mark.integration
@pytest.mark.parametrize('name', sorted(LAYOUTS))
def test_one_iteration_under_mmdets_own_train_py(name, tiny_coco, tmp_path):
    config = tmp_path / 'vitdet.py'
    config.write_text(UNDER_MMDET.format(base=str(SWAP / name), data=vitdet_tiny_data(tiny_coco)))
    train = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')
    log = run_tool(train, config, '--work-dir', tmp_path / 'work', cwd=tmp_path)
    assert re.search(r'Iter\(train\) \[1/1\].*loss_mask: [\d.]+', log), log[-2000:]
    assert (tmp_path / 'work' / 'iter_1.pth').is_file()
