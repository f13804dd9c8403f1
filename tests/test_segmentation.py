"""ADE20K segmentation: configs build, Runner train/val/test/resume, tools, upstream tools, errors."""
import glob
import os
import os.path as osp
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from PIL import Image

from nala_mm.datasets.synthetic_ade import ADE_CLASS_NAMES, generate_ade_like
from nala_mm.runtime import load_config

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PYTHON = sys.executable
SEG_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', '**', 'ade20k_*.py'), recursive=True))


@pytest.mark.parametrize('path', SEG_CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_every_segmentation_config_builds_its_model(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports['imports'] == ['nala_mm', 'nala_mm.compat']
    init_default_scope(cfg.default_scope)
    from mmseg.registry import MODELS
    model = MODELS.build(cfg.model)
    backbone = model.backbone
    # the first module after the backbone is wired to the variant's channels
    first = cfg.model.neck if 'neck' in cfg.model else cfg.model.decode_head
    assert list(first.in_channels) == list(backbone.embed_dims)
    if 'auxiliary_head' in cfg.model:
        assert cfg.model.auxiliary_head.in_channels == backbone.embed_dims[2]


def test_main_config_follows_the_recipe():
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'ade20k_nala_upernet.py'))
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
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py'))
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


TINY_CFG = """
_base_ = ['{base}']
data_root = '{root}'
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
train_cfg = dict(max_iters={iters}, val_interval={iters})
default_hooks = dict(checkpoint=dict(interval={iters}), logger=dict(interval=1))
param_scheduler = [dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=2)]
"""


@pytest.fixture(scope='module')
def tiny_ade(tmp_path_factory):
    root = tmp_path_factory.mktemp('ade') / 'ADEChallengeData2016'
    generate_ade_like(str(root), num_train=4, num_val=2, image_size=(96, 96), progress=False)
    return root


def write_tiny_config(directory, root, iters=2):
    path = directory / f'tiny_{iters}.py'
    path.write_text(TINY_CFG.format(
        base=osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py'), root=root,
        iters=iters))
    return str(path)


def run_tool(*args, cwd=REPO, timeout=600):
    proc = subprocess.run([PYTHON, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS='ignore'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def miou_from_label_maps(pred_dir, gt_dir, classes) -> float:
    """mIoU (%) of the label maps ``tools/test.py --out`` wrote, against the ADE20K-convention
    ground truth, computed here with numpy alone.

    Ground truth: 0 is unlabelled (ignored), value v is ADE class v - 1 (reduce_zero_label);
    the config's class subset keeps its order and every other ADE class is ignored. The
    written maps hold class + 1 (mmseg re-adds the reduced zero label). Per class, IoU is
    intersection over union summed over all images, on labelled pixels only; the mean runs
    over the classes present in ground truth or prediction.
    """
    lookup = np.full(256, 255, dtype=np.int64)
    for value, name in enumerate(ADE_CLASS_NAMES, start=1):
        if name in classes:
            lookup[value] = classes.index(name)
    num = len(classes)
    intersection, union = np.zeros(num), np.zeros(num)
    names = sorted(os.listdir(pred_dir))
    assert names
    for name in names:
        pred = np.asarray(Image.open(osp.join(pred_dir, name)), dtype=np.int64) - 1
        gt = lookup[np.asarray(Image.open(osp.join(gt_dir, name)), dtype=np.int64)]
        assert pred.shape == gt.shape and pred.min() >= 0 and pred.max() < num
        valid = gt != 255
        pred, gt = pred[valid], gt[valid]
        for c in range(num):
            intersection[c] += np.sum((pred == c) & (gt == c))
            union[c] += np.sum((pred == c) | (gt == c))
    present = union > 0
    return float(np.mean(intersection[present] / union[present]) * 100)


def test_train_val_test_and_resume_through_the_tools(tmp_path, tiny_ade):
    work = tmp_path / 'work'
    config = write_tiny_config(tmp_path, tiny_ade, iters=2)
    log = run_tool('tools/train.py', config, '--work-dir', str(work))
    assert re.search(r'Iter\(train\) \[2/2\].*loss: \d', log)
    # validation pass after training, on the weights saved as iter_2.pth
    val_miou = float(re.search(r'Iter\(val\) .*mIoU: ([\d.]+)', log).group(1))
    ckpt = work / 'iter_2.pth'
    assert ckpt.is_file()

    out = run_tool('tools/test.py', config, str(ckpt), '--work-dir', str(tmp_path / 'test'),
                   '--show-dir', str(tmp_path / 'overlays'), '--out', str(tmp_path / 'preds'))
    miou = float(re.search(r'metrics: aAcc=[\d.]+, mIoU=([\d.]+)', out).group(1))
    # same checkpoint and data as the train-time validation: the same number
    assert miou == pytest.approx(val_miou, abs=1e-6)
    # and the number the written label maps give against the ground truth (mmseg rounds to 2)
    own = miou_from_label_maps(tmp_path / 'preds', tiny_ade / 'annotations' / 'validation',
                               list(Config.fromfile(config).metainfo['classes']))
    assert own == pytest.approx(miou, abs=0.0051)
    assert len(glob.glob(str(tmp_path / 'overlays' / '**' / '*.png'), recursive=True)) == 2
    assert len(os.listdir(tmp_path / 'preds')) == 2

    longer = write_tiny_config(tmp_path, tiny_ade, iters=4)
    log = run_tool('tools/train.py', longer, '--work-dir', str(work), '--resume')
    assert 'resumed epoch: 0, iter: 2' in log
    assert re.search(r'Iter\(train\) \[4/4\]', log) and not re.search(r'Iter\(train\) \[1/4\]', log)


def test_one_iteration_in_process_learns_something(tmp_path, tiny_ade):
    cfg = load_config(write_tiny_config(tmp_path, tiny_ade, iters=1), work_dir=str(tmp_path / 'w'))
    runner = Runner.from_cfg(cfg)
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    runner.train()
    after = runner.model.state_dict()
    changed = [k for k in before if before[k].is_floating_point()
               and not torch.equal(before[k], after[k])]
    assert any(k.startswith('backbone.layers.0.blocks.0.attn.qkvg') for k in changed)
    metrics = runner.val()
    assert set(metrics) >= {'aAcc', 'mIoU', 'mAcc'}


def test_config_runs_under_mmsegs_own_train_script(tmp_path, tiny_ade):
    """Nothing of tools/train.py is needed: mmseg's packaged train script runs the config."""
    import mmseg
    script = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'train.py')
    log = run_tool(script, write_tiny_config(tmp_path, tiny_ade, iters=1), '--work-dir',
                   str(tmp_path / 'upstream'), cwd=str(tmp_path))
    assert re.search(r'Iter\(train\) \[1/1\]', log)
    assert (tmp_path / 'upstream' / 'iter_1.pth').is_file()


def test_infer_writes_overlays(tmp_path, tiny_ade):
    work = tmp_path / 'work'
    config = write_tiny_config(tmp_path, tiny_ade, iters=1)
    run_tool('tools/train.py', config, '--work-dir', str(work))
    images = tiny_ade / 'images' / 'validation'
    run_tool('tools/infer.py', config, str(work / 'iter_1.pth'), str(images), '--out-dir',
             str(tmp_path / 'infer'))
    assert len(os.listdir(tmp_path / 'infer' / 'vis')) == 2
    assert len(os.listdir(tmp_path / 'infer' / 'pred')) == 2


def test_missing_data_root_says_where_and_how(tmp_path):
    cfg = load_config(write_tiny_config(tmp_path, tmp_path / 'nowhere'), work_dir=str(tmp_path))
    init_default_scope('mmseg')
    from mmseg.registry import DATASETS
    with pytest.raises(FileNotFoundError, match=r'nowhere/images/training does not exist.*'
                                                r'ADEChallengeData2016\.zip.*make demo'):
        DATASETS.build(cfg.train_dataloader.dataset)


def test_other_seg_datasets_get_generic_help_without_ade20k(tmp_path):
    init_default_scope('mmseg')
    from mmseg.registry import DATASETS
    root = tmp_path / 'cityscapes'
    with pytest.raises(FileNotFoundError) as err:
        DATASETS.build(dict(type='CityscapesDataset', data_root=str(root),
                            data_prefix=dict(img_path='leftImg8bit/train',
                                             seg_map_path='gtFine/train'), pipeline=[]))
    message = str(err.value)
    assert 'ADE' not in message and 'make demo' not in message
    assert f'image folder {root}/leftImg8bit/train does not exist' in message
    assert f"data_root='{root}'" in message and '--cfg-options' in message


def test_annotation_folder_needed_only_when_the_pipeline_loads_it(tmp_path, tiny_ade):
    """Unlabelled images for inference are valid data: no annotation folder required."""
    root = tmp_path / 'unlabelled'
    root.mkdir()
    os.symlink(tiny_ade / 'images', root / 'images')
    init_default_scope('mmseg')
    from mmseg.registry import DATASETS
    images_only = dict(type='ADE20KDataset', data_root=str(root),
                       data_prefix=dict(img_path='images/validation',
                                        seg_map_path='annotations/validation'),
                       pipeline=[dict(type='LoadImageFromFile'), dict(type='PackSegInputs')])
    assert len(DATASETS.build(images_only)) == 2
    with pytest.raises(FileNotFoundError, match=r'annotation folder .*unlabelled/annotations/'
                                                r'validation does not exist.*ADEChallengeData'):
        DATASETS.build(dict(images_only, pipeline=[
            dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', reduce_zero_label=True),
            dict(type='PackSegInputs')]))


def test_data_behind_a_remote_file_backend_is_not_rejected(tmp_path, tiny_ade):
    """A data_root on another mmengine file backend (here a nalatest:// stand-in for s3://) is
    not checked against the local file system: the loader lists it through the backend."""
    from tests._remote_backend import remote
    cfg = load_config(write_tiny_config(tmp_path, remote(tiny_ade)), work_dir=str(tmp_path))
    init_default_scope('mmseg')
    from mmseg.registry import DATASETS
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    assert len(dataset) == 4
    assert dataset.get_data_info(0)['img_path'].startswith(remote(tiny_ade / 'images'))


def test_unreadable_image_is_named(tmp_path):
    root = tmp_path / 'ADEChallengeData2016'
    generate_ade_like(str(root), num_train=2, num_val=1, image_size=(64, 64), progress=False)
    cfg = load_config(write_tiny_config(tmp_path, root), work_dir=str(tmp_path))
    init_default_scope('mmseg')
    from mmseg.registry import DATASETS
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    broken = dataset.get_data_info(0)['img_path']
    with open(broken, 'wb') as f:
        f.write(b'this is not a jpeg')
    with pytest.raises(Exception, match=re.escape(osp.basename(broken))):
        dataset[0]


def test_two_process_training_with_torchrun_and_gloo(tmp_path, tiny_ade):
    """tools/dist_train.sh: mmengine's pytorch launcher, gloo on CPU, SyncBN as per-process BN."""
    work = tmp_path / 'dist'
    proc = subprocess.run(
        ['bash', 'tools/dist_train.sh', write_tiny_config(tmp_path, tiny_ade, iters=2), '2',
         '--work-dir', str(work)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PORT='29561', OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore',
                 PYTHON=PYTHON))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert 'Distributed launcher: pytorch' in log and 'Distributed training: True' in log
    assert "dist_cfg: {'backend': 'gloo'}" in log
    assert 'GPU number: 2' in log  # mmengine's name for the world size
    assert re.search(r'Iter\(train\) \[2/2\]', log)
    assert (work / 'iter_2.pth').is_file()
