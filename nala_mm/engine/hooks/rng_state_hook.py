"""RNG state in checkpoints, so a resumed run continues the exact random stream of every rank.

mmengine re-seeds at start-up and, on resume, replays the dataloader up to the saved iteration
(data workers are seeded per worker, so augmentations replay exactly), but it does not restore
the main process's generators: DropPath and dropout would draw different masks after a resume
than in an uninterrupted run. This hook saves torch/numpy/python (and CUDA) states with every
checkpoint and restores them right before the first iteration after the resume, i.e. after
mmengine's dataloader replay.

Multi-process runs: mmengine writes checkpoints on rank 0 only (``Runner.save_checkpoint`` is
``master_only``), so ``before_save_checkpoint`` never runs on the other ranks and cannot gather
their states there (a collective on one rank would hang). Instead every rank hands its state
to rank 0 with ``all_gather_object`` in ``after_train_iter``/``after_train_epoch`` (and
``after_val_epoch`` for ``save_best``) whenever a ``CheckpointHook`` is about to save: this
hook's priority (NORMAL) runs before the ``CheckpointHook`` (VERY_LOW) in the same call. The
checkpoint then holds ``{'world_size': W, 'ranks': {rank: state}}`` and, on resume, each rank
takes its own entry.
"""
import logging
import random
from typing import List, Optional, Tuple

import numpy as np
import torch
from mmengine.dist import all_gather_object
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log

from ...registry import register_hook

STATE_KEY = 'rng_state'


def capture_rng_state() -> dict:
    """This process's torch/numpy/python (and CUDA) generator states."""
    state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                 python=random.getstate())
    if torch.cuda.is_available():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    torch.set_rng_state(state['torch'])
    np.random.set_state(state['numpy'])
    random.setstate(state['python'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


def select_rng_state(saved: dict, rank: int, world_size: int,
                     shared_stream: bool) -> Tuple[Optional[dict], Optional[str]]:
    """The state rank ``rank`` of a ``world_size``-process run restores, and a warning (or None).

    ``shared_stream``: every rank draws the same stream (``randomness.diff_rank_seed`` False),
    so any saved rank's state continues every rank's stream exactly, whatever the world size.
    Otherwise (per-rank seeds) a rank restores its own saved state; when the world size changed,
    ranks the checkpoint has no state for keep their fresh seeding (seed + rank), so that no two
    ranks ever share a stream.
    """
    states = {int(rank): state for rank, state in saved['ranks'].items()}
    saved_world = int(saved['world_size'])
    if world_size == saved_world and set(states) == set(range(saved_world)):
        return states[rank], None
    have = sorted(states)
    if shared_stream:
        return states.get(rank, states[have[0]]), None
    what = (f'the checkpoint holds RNG states of ranks {have} (world size {saved_world}), '
            f'this run has world size {world_size}')
    missing = [r for r in range(world_size) if r not in states]
    note = (f'RNGStateHook: {what}; with randomness.diff_rank_seed=True each rank needs its own '
            f'stream: ranks {[r for r in range(world_size) if r in states]} continue their saved '
            f'streams, ranks {missing} keep their fresh per-rank seeds (seed + rank), so '
            f'random draws after the resume differ from an uninterrupted run')
    return states.get(rank), note


def _checkpoint_due(runner, after: str) -> bool:
    """Whether a ``CheckpointHook`` of ``runner`` saves in this ``after_*`` call (its own rules);
    every rank reaches the same answer, so the collective is entered by all or none."""
    for hook in runner.hooks:
        if not isinstance(hook, CheckpointHook):
            continue
        if after == 'iter' and not hook.by_epoch:
            if hook.every_n_train_iters(runner, hook.interval, hook.save_begin) or \
                    (hook.save_last and hook.is_last_train_iter(runner)):
                return True
        elif after == 'epoch' and hook.by_epoch:
            if hook.every_n_epochs(runner, hook.interval, hook.save_begin) or \
                    (hook.save_last and hook.is_last_train_epoch(runner)):
                return True
        elif after == 'val' and getattr(hook, 'save_best', None):
            return True
    return False


@register_hook
class RNGStateHook(Hook):
    """Save and restore the random generators of every rank with each checkpoint."""

    priority = 'NORMAL'  # before the CheckpointHook (VERY_LOW), which saves in the same call

    def __init__(self):
        self._pending: Optional[dict] = None
        # (iter, epoch) of the last gather, and every rank's states then
        self._gathered: Optional[Tuple[Tuple[int, int], List[dict]]] = None

    def _gather_if_saving(self, runner, after: str) -> None:
        if runner.world_size > 1 and _checkpoint_due(runner, after):
            self._gathered = ((runner.iter, runner.epoch), all_gather_object(capture_rng_state()))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._gather_if_saving(runner, 'iter')

    def after_train_epoch(self, runner) -> None:
        self._gather_if_saving(runner, 'epoch')

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._gather_if_saving(runner, 'val')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        # runs on rank 0 only; its own state is taken now, the others' from the gather above
        ranks = {0: capture_rng_state()}
        gathered, self._gathered = self._gathered, None
        if gathered is not None and gathered[0] == (runner.iter, runner.epoch):
            ranks.update({rank: state for rank, state in enumerate(gathered[1]) if rank != 0})
        elif runner.world_size > 1:
            print_log('RNGStateHook: this checkpoint was not announced by a CheckpointHook, so '
                      'it holds rank 0\'s RNG state only', logger='current',
                      level=logging.WARNING)
        checkpoint[STATE_KEY] = dict(world_size=runner.world_size, ranks=ranks)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        saved = checkpoint.get(STATE_KEY)
        if saved is None:
            self._pending = None
            return
        randomness = getattr(runner, '_randomness_cfg', None) or \
            runner.cfg.get('randomness', None) or {}
        state, warning = select_rng_state(saved, runner.rank, runner.world_size,
                                          shared_stream=not randomness.get('diff_rank_seed',
                                                                           False))
        if warning:
            print_log(warning, logger='current', level=logging.WARNING)
        self._pending = state

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        restore_rng_state(state)
