"""RNG state in checkpoints, so a resumed run continues the exact random stream.

mmengine re-seeds at start-up and, on resume, replays the dataloader up to the saved iteration
(data workers are seeded per worker, so augmentations replay exactly), but it does not restore
the main process's generators: DropPath and dropout would draw different masks after a resume
than in an uninterrupted run. This hook saves torch/numpy/python (and CUDA) states with every
checkpoint and restores them right before the first iteration after the resume, i.e. after
mmengine's dataloader replay.
"""
import random
from typing import Optional

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

STATE_KEY = 'rng_state'


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Save and restore the random generators with each checkpoint."""

    priority = 'NORMAL'

    def __init__(self):
        self._pending: Optional[dict] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                     python=random.getstate())
        if torch.cuda.is_available():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint[STATE_KEY] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        self._pending = checkpoint.get(STATE_KEY)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        torch.set_rng_state(state['torch'])
        np.random.set_state(state['numpy'])
        random.setstate(state['python'])
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['cuda'])
