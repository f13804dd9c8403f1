"""A hook for the multi-process resume test, imported by its config (``custom_imports``).

Before every training iteration (after ``RNGStateHook`` may have restored the generators) each
rank records the next value its torch, numpy and python generators would draw, without
consuming them (the draws come from copies of the states), in
``<work_dir>/rng_probe_rank<rank>.jsonl``.
"""
import json
import os.path as osp
import random

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def peek_rng() -> dict:
    """The next uniform draw of each global generator, leaving the generators untouched."""
    generator = torch.Generator()
    generator.set_state(torch.get_rng_state())
    numpy_copy = np.random.RandomState()
    numpy_copy.set_state(np.random.get_state())
    python_copy = random.Random()
    python_copy.setstate(random.getstate())
    return dict(torch=torch.rand(1, generator=generator).item(),
                numpy=float(numpy_copy.random_sample()), python=python_copy.random())


@HOOKS.register_module()
class RNGProbeHook(Hook):
    priority = 'LOW'  # after RNGStateHook (NORMAL) has restored the states

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        path = osp.join(runner.work_dir, f'rng_probe_rank{runner.rank}.jsonl')
        with open(path, 'a') as f:
            f.write(json.dumps(dict(iter=runner.iter + 1, **peek_rng())) + '\n')
