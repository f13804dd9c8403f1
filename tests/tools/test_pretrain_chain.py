"""The chain to dense prediction: an mmpretrain classifier trained here initialises UperNet's
backbone through ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')``; the
backbone then holds the classifier's weights, and only the dense outputs' norms (``out_norm*``)
keep their initialisation; one fine-tuning iteration runs. Tiny models and generated data."""
import os.path as osp
import re

import torch
from mmengine.config import Config
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader
from mmseg.registry import MODELS as SEG_MODELS

from nala_mm import compat
from nala_mm.datasets.synthetic_imagenet import generate_imagenet_like
from tests.helpers import DEMO_SEG_CFG, REPO, write_seg_config
from tests.support.pretrain import requires_mmpretrain

pytestmark = requires_mmpretrain

DEMO_CLS_CFG = osp.join(REPO, 'configs', 'demo', 'imagenet_demo_nala_cls.py')


# Runner.from_cfg's fields (mmengine 0.10), without the config itself: the Runner would format the
# whole config for its log and dump twice (seconds of yapf per Runner, nothing this test checks).
RUNNER_FIELDS = ('model', 'work_dir', 'train_dataloader', 'train_cfg', 'optim_wrapper',
                 'param_scheduler', 'default_hooks', 'custom_hooks', 'data_preprocessor',
                 'env_cfg', 'visualizer', 'default_scope', 'randomness', 'auto_scale_lr')


def runner(cfg: Config) -> Runner:
    """A training-only Runner of ``cfg`` (no validation, no evaluators)."""
    return Runner(**{k: cfg.get(k) for k in RUNNER_FIELDS if cfg.get(k) is not None})


def pretrain(tmp_path) -> str:
    """Two iterations of the classification demo on a tiny generated set; its checkpoint."""
    root = tmp_path / 'imagenet'
    generate_imagenet_like(str(root), num_train=4, num_val=1, image_size=(48, 48),
                           progress=False)
    cfg = Config.fromfile(DEMO_CLS_CFG)
    cfg.work_dir = str(tmp_path / 'cls')
    cfg.train_dataloader.update(batch_size=8, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.data_root = str(root)
    cfg.train_dataloader.dataset.pipeline[1].scale = 48
    cfg.train_cfg.update(max_epochs=1)
    cfg.default_hooks.checkpoint.interval = 1
    cfg.param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=True)]
    runner(cfg).train()
    return str(tmp_path / 'cls' / 'epoch_1.pth')


def test_a_classifier_checkpoint_initialises_upernet_and_fine_tunes(tmp_path, tiny_ade):
    checkpoint = pretrain(tmp_path)
    # read as the backbone will read it in the tools (weights-only, with nala_mm.compat)
    with compat.installed():
        classifier = CheckpointLoader.load_checkpoint(checkpoint, map_location='cpu')['state_dict']
    trained = {k[len('backbone.'):]: v for k, v in classifier.items()
               if k.startswith('backbone.')}
    assert trained and any(k.startswith('neck.') for k in classifier)

    cls_backbone = Config.fromfile(DEMO_CLS_CFG).model.backbone
    mixers = repr(tuple(cls_backbone.mixers))
    init = (f"dict(_delete_=True, type='Pretrained', checkpoint={checkpoint!r}, "
            "prefix='backbone.')")  # (the demo's init_cfg is None)
    # the segmentation demo, with the classifier's mixers and this checkpoint as initialisation
    path = write_seg_config(tmp_path, tiny_ade, iters=1, extra=(
        f'model = dict(backbone=dict(mixers={mixers}, init_cfg={init}))\n'))
    cfg = Config.fromfile(path)
    assert cfg.model.backbone.arch == cls_backbone.arch  # the same backbone

    segmentor = SEG_MODELS.build(cfg.model)
    fresh = {k: v.clone() for k, v in segmentor.backbone.state_dict().items()}
    segmentor.init_weights()
    loaded = segmentor.backbone.state_dict()
    new = sorted(k for k in loaded if k not in trained)
    assert new and all(re.match(r'out_norm[0-3]\.', k) for k in new), new
    assert sorted(k for k in trained if k not in loaded) == []
    for key, value in trained.items():
        assert torch.equal(loaded[key], value), key
    for key in new:  # kept at their initialisation
        assert torch.equal(loaded[key], fresh[key]), key

    cfg.work_dir = str(tmp_path / 'seg')
    fine_tuning = runner(cfg)
    fine_tuning.train()
    assert fine_tuning.iter == 1
    after = fine_tuning.model.backbone.state_dict()
    moved = [k for k in trained if not torch.equal(after[k], trained[k])]
    assert moved  # the iteration fine-tuned the loaded backbone
    assert osp.isfile(tmp_path / 'seg' / 'iter_1.pth')
    assert DEMO_SEG_CFG in open(path).read()
