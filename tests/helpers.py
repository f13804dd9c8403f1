"""Plain helpers shared by the test modules (fixtures live in conftest.py)."""
import glob
import json
import logging
import os
import os.path as osp
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
import torch
import torch.nn.functional as F

from nala_mm.ops import FeatureMap

REPO = Path(__file__).resolve().parents[1]
# What a device-parametrised test runs on (fla's pattern): the CPU, and CUDA where there is one;
# `make test-cuda` selects the CUDA cases (-m cuda). Without a GPU they are skipped, never faked.
DEVICES = ['cpu', pytest.param('cuda', marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device')])]
PYTHON = sys.executable
DEMO_SEG_CFG = str(REPO / 'configs' / 'demo' / 'ade20k_demo_nala_upernet.py')
DEMO_DET_CFG = str(REPO / 'configs' / 'demo' / 'coco_demo_nala_mask-rcnn.py')
# A backbone small enough for unit tests, with every stage's head dim divisible by 4
TINY_ARCH = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 4),
                 mlp_ratios=(2, 2, 2, 2))


class SquaredReLU(FeatureMap):
    """``relu(x)^2``: a user's map that the package does not ship (docs/user_guides/mixers.md's
    example), registered by being defined."""
    flops_per_feature = 2

    def forward(self, x):
        return F.relu(x).square()

    def backward(self, x, d_features):
        return d_features * 2 * F.relu(x)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||``."""
    return ((actual - expected).norm() / expected.norm()).item()


def grad_errors(actual, expected) -> list:
    """Per gradient pair: the relative error, except for gradients that are zero in exact
    arithmetic (a conv bias before BatchNorm: norm under 1e-3 of the largest), whose float noise
    is measured against the largest gradient's norm instead."""
    scale = max(g.norm().item() for g in expected)
    return [((a - e).norm() / max(e.norm().item(), 1e-3 * scale)).item()
            for a, e in zip(actual, expected)]


def value_and_grads(fn, q, k, v, weights):
    """``fn(q, k, v)`` and the gradients of ``sum(fn * weights)`` w.r.t. q, k, v, flat:
    ``(out, dq, dk, dv)`` (a parity check compares the four)."""
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    return (out.detach(), *torch.autograd.grad((out * weights).sum(), (q, k, v)))


def tool_env(**extra) -> dict:
    """The environment a tool runs in: the repository first on the path, then what the test
    run had there (tests/support/pretrain.py)."""
    path = os.pathsep.join([str(REPO)] + [p for p in os.environ.get('PYTHONPATH', '').split(
        os.pathsep) if p])
    return dict(os.environ, PYTHONPATH=path, PYTHONWARNINGS='ignore', **extra)


def run_tool(*args, cwd=REPO, timeout=600, env=None) -> str:
    """Run ``python *args`` from the repository; its output, after asserting success."""
    proc = subprocess.run([PYTHON, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env or tool_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def run_failing_tool(*args, timeout=300) -> str:
    """Run ``python *args``; its output, after asserting failure."""
    proc = subprocess.run([PYTHON, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=tool_env())
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stdout + proc.stderr


def free_port() -> int:
    """A port nothing listens on now, for torchrun's rendezvous."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class LogRecords:
    """Collects what mmengine's current logger emits (it does not propagate to pytest)."""

    def __enter__(self):
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


SEG_CFG = """
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


def write_seg_config(directory, root, iters=2, extra='', name=None) -> str:
    """The segmentation demo config on ``root`` for ``iters`` iterations; ``extra`` is appended
    (a re-assigned dict replaces the inherited one whole, so it must repeat the data root)."""
    path = Path(directory) / (name or f'seg_{iters}.py')
    path.write_text(SEG_CFG.format(base=DEMO_SEG_CFG, root=root, iters=iters) + extra)
    return str(path)


DET_CFG = """
_base_ = ['{base}']
data_root = '{root}/'
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs={epochs}, val_interval={epochs})
default_hooks = dict(checkpoint=dict(interval={epochs}), logger=dict(interval=1))
"""


def write_det_config(directory, root, epochs=1, extra='', name='det.py') -> str:
    """The detection demo config on ``root`` for ``epochs`` epochs; ``extra`` is appended."""
    path = Path(directory) / name
    path.write_text(DET_CFG.format(base=DEMO_DET_CFG, root=root, epochs=epochs) + extra)
    return str(path)


def load_run_checkpoint(path) -> dict:
    """A checkpoint a tool's run wrote (message hub included), read weights-only as the tools
    read it: with nala_mm.compat's changes for the call (the suite runs without them)."""
    from nala_mm import compat
    with compat.installed():
        return torch.load(path, map_location='cpu')


def logged_scalars(work_dir) -> Dict[int, dict]:
    """Per-iteration records of the LocalVisBackend's scalars.json (full precision)."""
    records = {}
    for path in sorted(glob.glob(osp.join(str(work_dir), '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if 'iter' in record and 'loss' in record:
                    records[record['iter']] = record
    return records


def coco_evaluate(gt, results: list, iou_type: str, cat_ids: list):
    """pycocotools' evaluation of ``results`` (COCO-format dicts) against the ``COCO`` object
    ``gt``, with mmdet's maximum detections; the evaluated ``COCOeval``."""
    from pycocotools.cocoeval import COCOeval
    evaluation = COCOeval(gt, gt.loadRes(results), iou_type)
    evaluation.params.catIds = cat_ids
    evaluation.params.maxDets = [100, 300, 1000]
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return evaluation


def vitdet_tiny_data(root) -> str:
    """Config text: the ViTDet configs' training data (LSJ's RepeatDataset) on generated COCO
    data at ``side`` (a variable the config defines), fixed-size, labels of the demo classes."""
    classes = ('disc', 'square', 'triangle', 'star')
    return (f"train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False, "
            f"dataset=dict(dataset=dict(data_root={str(root) + '/'!r}, "
            f"metainfo=dict(classes={classes!r}), pipeline=["
            "dict(type='LoadImageFromFile'), "
            "dict(type='LoadAnnotations', with_bbox=True, with_mask=True), "
            "dict(type='Resize', scale=side, keep_ratio=False), dict(type='PackDetInputs')])))\n")


def _rank_main(rank: int, target, world_size: int, store_path: str, args: tuple) -> None:
    import datetime

    import torch.distributed as dist
    torch.set_num_threads(1)  # the ranks share the machine's cores
    # a collective that one rank never reaches fails within the timeout instead of hanging
    dist.init_process_group('gloo', store=dist.FileStore(store_path, world_size), rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    try:
        target(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(target, world_size: int, tmp_path, *args) -> None:
    """``target(rank, world_size, *args)`` in ``world_size`` fresh processes joined in one gloo
    group (a file store under ``tmp_path``); an exception in any rank fails the caller with
    that rank's traceback. ``target`` must be importable (a test module's function)."""
    import torch.multiprocessing as mp
    store = Path(tmp_path) / 'gloo_store'
    mp.spawn(_rank_main, args=(target, world_size, str(store), args), nprocs=world_size)
