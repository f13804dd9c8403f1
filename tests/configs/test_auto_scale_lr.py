"""Learning-rate scaling: every config says the total batch its learning rate was set for
(``auto_scale_lr.base_batch_size`` = the recipe's processes x ``train_dataloader.batch_size``),
and ``tools/train.py --auto-scale-lr`` has mmengine's Runner scale the rate to the run's batch."""
import glob
import os.path as osp

import pytest
from mmengine.config import Config

from nala_mm.apis.config_loading import enable_auto_scale_lr, load_config
from tests.configs.test_configs import load
from tests.helpers import DEMO_SEG_CFG, REPO

RUNNABLE = sorted(p for p in glob.glob(str(REPO / 'configs' / '**' / '*.py'), recursive=True)
                  if '/_base_/' not in p)


def recipe_processes(path: str) -> int:
    """GPUs (processes) of the recipe a config follows, as its comments and name say."""
    name = osp.basename(path)
    if '/demo/' in path:
        return 1  # one CPU process
    if '_vitdet-' in name:
        return 32  # ViTDet's recipe: 32 GPUs x 2 images
    if name.endswith('_fpn.py'):
        return 4  # configs/_base_/nala_fpn.py: 4 GPUs x 4 images
    return 8  # the UperNet, Mask R-CNN and RetinaNet recipes, and the stock ones in swap/


@pytest.mark.parametrize('path', RUNNABLE, ids=lambda p: osp.relpath(p, REPO))
def test_every_config_names_its_recipe_batch(path):
    cfg = load(path)
    scaling = cfg.get('auto_scale_lr')
    assert scaling is not None, 'auto_scale_lr missing'
    assert scaling['enable'] is False  # the recipe's rate unless --auto-scale-lr asks
    expected = recipe_processes(path) * cfg.train_dataloader.batch_size
    assert scaling['base_batch_size'] == expected, (scaling, expected)


def test_the_main_recipes_are_16_images():
    for name in ('ade20k_nala_upernet.py', 'ade20k_nala-t_fpn.py', 'coco_nala_mask-rcnn_1x.py',
                 'coco_nala_retinanet_1x.py'):
        assert load(str(REPO / 'configs' / name)).auto_scale_lr.base_batch_size == 16, name


def test_auto_scale_lr_flag_needs_the_recipe_batch():
    cfg = Config(dict(optim_wrapper=dict(optimizer=dict(lr=0.1))))
    with pytest.raises(ValueError, match=r"auto_scale_lr = dict\(enable=False, base_batch_size=N\)"
                                         r".*got auto_scale_lr=None"):
        enable_auto_scale_lr(cfg)
    cfg.auto_scale_lr = dict(enable=False, base_batch_size='16')
    with pytest.raises(ValueError, match="base_batch_size': '16'"):
        enable_auto_scale_lr(cfg)
    cfg.auto_scale_lr = dict(enable=False, base_batch_size=16)
    enable_auto_scale_lr(cfg)
    assert cfg.auto_scale_lr == dict(enable=True, base_batch_size=16)


@pytest.mark.parametrize('flag, batch, expected_lr', [(False, 2, 2e-3), (True, 2, 5e-4),
                                                      (True, 16, 4e-3)])
def test_the_runner_scales_the_learning_rate_by_the_total_batch(tmp_path, flag, batch,
                                                                expected_lr):
    """The demo's rate (2e-3) was set for 8 images: 2 images take a quarter of it, 16 twice."""
    from mmengine.runner import Runner
    cfg = load_config(DEMO_SEG_CFG, work_dir=str(tmp_path),
                      cfg_options={'train_dataloader.batch_size': batch})
    if flag:
        enable_auto_scale_lr(cfg)
    runner = Runner.from_cfg(cfg)
    wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.scale_lr(wrapper, runner.auto_scale_lr)
    rates = [group['lr'] for group in wrapper.optimizer.param_groups]
    assert rates == pytest.approx([expected_lr] * len(rates))
