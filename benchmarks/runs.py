"""Training runs through tools/train.py, each in a fresh process (a study's runs must not share
state), and the config template of a mixer comparison (ablation.py, longrange.py)."""
import json
import os
import os.path as osp
import subprocess
import sys
import time

from nala_mm.analysis.measure import error_of

from paths import REPO

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
