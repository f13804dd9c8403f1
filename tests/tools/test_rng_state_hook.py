"""RNGStateHook as units, in one process with a real mmengine ``Runner``: what it saves with a
checkpoint, when it restores (the first iteration after the resume, never before, once), and
which saved state each rank takes when the world size changes. The resume through the tools,
killed and under torchrun, is test_resume.py's."""
import logging
import random

import numpy as np
import pytest
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner

from nala_mm.engine.hooks.rng_state_hook import (
    STATE_KEY,
    RNGStateHook,
    capture_rng_state,
    select_rng_state,
)
from tests.helpers import LogRecords


class Linear(BaseModel):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return self.fc(inputs)


def runner(tmp_path, diff_rank_seed: bool = False) -> Runner:
    return Runner(model=Linear(), work_dir=str(tmp_path),
                  randomness=dict(seed=0, diff_rank_seed=diff_rank_seed))


def draws() -> tuple:
    """The next draw of each generator the hook keeps (torch, numpy, python)."""
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()


def test_a_checkpoint_holds_the_state_that_continues_every_stream(tmp_path):
    hook, checkpoint = RNGStateHook(), {}
    hook.before_save_checkpoint(runner(tmp_path), checkpoint)
    saved = checkpoint[STATE_KEY]
    assert saved['world_size'] == 1 and list(saved['ranks']) == [0]
    expected = draws()  # what an uninterrupted run draws next
    hook.after_load_checkpoint(runner(tmp_path), {STATE_KEY: saved})
    hook.before_train_iter(runner(tmp_path), 0)
    assert draws() == expected


def test_the_state_is_restored_at_the_first_iteration_after_the_resume_and_once(tmp_path):
    """mmengine replays the dataloader between loading and the first iteration: a restore at
    load time would be consumed by that replay."""
    hook, checkpoint, run = RNGStateHook(), {}, runner(tmp_path)
    hook.before_save_checkpoint(run, checkpoint)
    expected = draws()
    hook.after_load_checkpoint(run, checkpoint)
    assert draws() != expected  # loading changed no generator ...
    hook.before_train_iter(run, 0)  # ... the first iteration restores
    assert draws() == expected
    hook.before_train_iter(run, 1)  # and only that one
    assert draws() != expected


def test_a_checkpoint_without_a_state_drops_a_pending_one(tmp_path):
    """A second load (a run resumed from a checkpoint saved without the hook) restores
    nothing, not the state of an earlier load."""
    hook, checkpoint, run = RNGStateHook(), {}, runner(tmp_path)
    hook.before_save_checkpoint(run, checkpoint)
    hook.after_load_checkpoint(run, checkpoint)
    hook.after_load_checkpoint(run, {'state_dict': {}})
    before = capture_rng_state()['torch']
    hook.before_train_iter(run, 0)
    assert torch.equal(capture_rng_state()['torch'], before)


def rank_states(count: int) -> dict:
    """Per rank a state whose torch stream starts from a seed of its own (seed = rank)."""
    states = {}
    for rank in range(count):
        torch.manual_seed(rank)
        states[rank] = capture_rng_state()
    return states


@pytest.mark.parametrize('diff_rank_seed', [True, False])
def test_a_one_process_resume_of_a_two_rank_run_takes_rank_0s_stream(tmp_path, diff_rank_seed):
    """Per-rank seeds (``diff_rank_seed``): rank 0 continues its own stream, with a warning that
    the world size changed; one shared stream: any rank's state continues it, silently."""
    hook, run = RNGStateHook(), runner(tmp_path, diff_rank_seed)
    saved = dict(world_size=2, ranks=rank_states(2))
    with LogRecords() as log:
        hook.after_load_checkpoint(run, {STATE_KEY: saved})
    hook.before_train_iter(run, 0)
    restored = torch.rand(3)
    torch.manual_seed(0)  # rank 0's stream
    assert torch.equal(restored, torch.rand(3))
    warnings = [m for m in log.messages(logging.WARNING) if 'RNGStateHook' in m]
    assert bool(warnings) == diff_rank_seed
    if diff_rank_seed:
        assert 'world size 2' in warnings[0] and 'world size 1' in warnings[0]


def test_rank_selection_when_the_world_size_changes():
    saved = dict(world_size=2, ranks={rank: dict(tag=rank) for rank in range(2)})
    # the same world: each rank its own state, no warning
    assert [select_rng_state(saved, rank, 2, shared_stream=False) for rank in range(2)] == [
        (dict(tag=0), None), (dict(tag=1), None)]
    # grown to 3 ranks with per-rank seeds: ranks 0, 1 continue, rank 2 keeps its fresh seed
    picks = [select_rng_state(saved, rank, 3, shared_stream=False) for rank in range(3)]
    assert [state for state, _ in picks] == [dict(tag=0), dict(tag=1), None]
    warning = picks[2][1]
    assert 'world size 2' in warning and 'world size 3' in warning and 'ranks [2]' in warning
    # shrunk to 1 rank: it continues rank 0's stream, with the warning
    state, warning = select_rng_state(saved, 0, 1, shared_stream=False)
    assert state == dict(tag=0) and 'world size 1' in warning
    # diff_rank_seed=False: every rank draws one stream, so any saved state continues it exactly
    assert select_rng_state(saved, 2, 3, shared_stream=True) == (dict(tag=0), None)
    # a checkpoint that holds rank 0's state only (saved without a CheckpointHook's announce):
    # in the same world, rank 1 keeps its fresh seed, or shares rank 0's single stream
    partial = dict(world_size=2, ranks={0: dict(tag=0)})
    state, warning = select_rng_state(partial, 1, 2, shared_stream=False)
    assert state is None and 'ranks [1]' in warning
    assert select_rng_state(partial, 1, 2, shared_stream=True) == (dict(tag=0), None)
    # ranks may come back from a checkpoint as strings (a JSON round trip): the same choice
    as_text = dict(world_size='2', ranks={str(rank): s for rank, s in saved['ranks'].items()})
    assert select_rng_state(as_text, 1, 2, shared_stream=False) == (dict(tag=1), None)
