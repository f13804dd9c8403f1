"""Training runs through tools/train.py, each in a fresh process (a study's runs must not share
state), the config template of a mixer comparison (ablation.py, projects/longrange/study.py),
and the small Swin UperNet recipe on the demo data that the swap studies train
(swap_finetune.py, linearize.py)."""
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

from nala_mm.analysis.measure import error_of

from .paths import REPO

MIXER_SWEEP_CONFIG = """_base_ = [{base!r}]
model = dict(backbone=dict(mixers=[{mixer!r}] * 4))
randomness = dict(seed={seed})
max_iters = {iters}
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end={warmup}),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin={warmup}, end=max_iters, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(logger=dict(type='LoggerHook', interval={log_interval},
                                log_metric_by_epoch=False),
                     checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters,
                                     max_keep_ckpts=1))
"""


DEMO = osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py')
# the swap studies' Swin: Swin-T's layout at a width the demo trains in minutes
SMALL_SWIN = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7,
                  drop_path_rate=0.1)
SMALL_SWIN_CONFIG = """_base_ = [{demo!r}]
model = dict(
    backbone=dict(_delete_=True, type='NaLaSwinTransformer', mixers={mixers!r}, init_cfg=None,
                  **{swin!r}),
    decode_head=dict(in_channels=[32, 64, 128, 256]), auxiliary_head=dict(in_channels=128))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={{
    'relative_position_bias_table': dict(decay_mult=0.), 'norm': dict(decay_mult=0.),
    'mixer.ln': dict(decay_mult=0.)}}))
train_dataloader = dict(batch_size=4)
"""
# what a study's run changes in any config: seed, schedule, evaluation points, the start
SCHEDULE = """randomness = dict(seed={seed})
load_from = {load_from!r}
max_iters = {iters}
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end={warmup}),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin={warmup}, end=max_iters, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval={val_every})
default_hooks = dict(logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
                     checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters,
                                     max_keep_ckpts=1))
"""


def small_swin_config(mixers, seed: int, iters: int, load_from=None,
                      val_every=None) -> str:
    """The small Swin UperNet on the demo data with ``mixers`` (``'softmax'``: Swin's own
    windows), trained ``iters`` iterations (evaluated every ``val_every``, default once at the
    end), starting from ``load_from``."""
    return SMALL_SWIN_CONFIG.format(demo=DEMO, mixers=tuple(mixers), swin=SMALL_SWIN) + \
        schedule(seed, iters, load_from, val_every)


def schedule(seed: int, iters: int, load_from=None, val_every=None) -> str:
    """The config lines that set a run's seed, its schedule (warm-up over the first tenth,
    then poly decay), its evaluation interval and its starting checkpoint."""
    return SCHEDULE.format(seed=seed, load_from=load_from, iters=iters,
                           warmup=max(iters // 10, 1), val_every=val_every or iters)


def tool_env() -> dict:
    """The environment of a tools/ process: the repository importable, warnings silenced (the
    last line of stderr is what a failure reports)."""
    return dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS='ignore')


def train_config(config_text: str, name: str, work_root: str) -> dict:
    """Write ``config_text`` to ``work_root/name.py`` and train it through tools/train.py in a
    fresh process. Returns ``records`` (every line of the run's scalars.json: training logs and
    evaluation metrics) and ``wall_seconds``, or ``error`` (the last line of the run's
    stderr)."""
    work_dir, config = osp.join(work_root, name), osp.join(work_root, f'{name}.py')
    shutil.rmtree(work_dir, ignore_errors=True)  # the records must be this run's alone
    with open(config, 'w') as f:
        f.write(config_text)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'train.py'), config,
                           '--work-dir', work_dir], cwd=REPO, capture_output=True, text=True,
                          env=tool_env())
    wall = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        return dict(error=error_of(proc))
    records = []
    for root, _, files in os.walk(work_dir):
        if 'scalars.json' in files:
            with open(osp.join(root, 'scalars.json')) as f:
                records += [json.loads(line) for line in f if line.strip()]
    return dict(records=records, wall_seconds=wall)


def mixer_sweep_config(base: str, mixer: dict, seed: int, iters: int,
                       log_every: int = 50) -> str:
    """A config that trains ``base`` with ``mixer`` in all four stages for ``iters`` iterations
    (warm-up over the first tenth, then poly decay), seeded, evaluated and saved once at the
    end: one run of a mixer comparison."""
    return MIXER_SWEEP_CONFIG.format(base=base, mixer=mixer, seed=seed, iters=iters,
                                     warmup=max(iters // 10, 1),
                                     log_interval=max(min(log_every, iters // 4), 1))
