"""Crash safety and multi-process training through the tools: a run killed with SIGKILL resumes
to the losses of an uninterrupted one; under torchrun (gloo) every rank continues its own random
stream after a resume, all ranks end with the same weights and optimizer state, the epoch-based
path keeps every rank's RNG state, and tools/dist_test.sh gives the single-process mIoU."""
import json
import re
import signal
import subprocess

import pytest

from tests.helpers import (
    PYTHON,
    REPO,
    free_port,
    load_run_checkpoint,
    logged_scalars,
    run_tool,
    tool_env,
    write_seg_config,
)

pytestmark = pytest.mark.integration

# Deterministic and exactly logged: window 1 (no smoothing), one data worker (seeded per worker,
# so the resumed dataloader replay is exact), DropPath on to exercise the RNG-state hook.
CRASH_EXTRA = """
custom_imports = dict(imports=['nala_mm', 'tests.support.kill_hook'],
                      allow_failed_imports=False)
randomness = dict(seed=0, deterministic=True)
log_processor = dict(window_size=1)
train_dataloader = dict(batch_size=2, num_workers=1, persistent_workers=True,
                        dataset=dict(data_root=data_root))
default_hooks = dict(checkpoint=dict(interval=2, max_keep_ckpts=4), logger=dict(interval=1))
model = dict(backbone=dict(drop_path_rate=0.3))
"""
ITERS, KILL_AFTER = 8, 5  # checkpoints at 2, 4, 6, 8: the kill falls between two of them


def start_training(config, work_dir, *extra) -> subprocess.Popen:
    # one thread per run: the uninterrupted and the crashing run share the machine's cores, and
    # every run must sum in the same order for the losses to match bit for bit
    return subprocess.Popen([PYTHON, 'tools/train.py', config, '--work-dir', str(work_dir),
                             *extra], cwd=REPO, env=tool_env(OMP_NUM_THREADS='1'),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def train(config, work_dir, *extra) -> subprocess.CompletedProcess:
    return finish(start_training(config, work_dir, *extra))


def test_sigkill_then_resume_continues_with_identical_losses(tmp_path, small_ade):
    config = write_seg_config(tmp_path, small_ade, iters=ITERS, extra=CRASH_EXTRA)
    crashing = write_seg_config(tmp_path, small_ade, iters=ITERS, name='crashing.py',
                                extra=CRASH_EXTRA + f'custom_hooks = [dict(type="RNGStateHook"), '
                                                    f'dict(type="KillAfterIterHook", '
                                                    f'iteration={KILL_AFTER})]\n')
    straight, crashed = tmp_path / 'straight', tmp_path / 'crashed'
    # the uninterrupted and the crashing run side by side
    runs = [start_training(config, straight), start_training(crashing, crashed)]
    done, killed = (finish(proc) for proc in runs)
    assert done.returncode == 0, done.stderr[-2000:]
    reference = {it: r['loss'] for it, r in logged_scalars(straight).items()}
    assert sorted(reference) == list(range(1, ITERS + 1))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert sorted(logged_scalars(crashed)) == list(range(1, KILL_AFTER + 1))
    assert (crashed / 'iter_4.pth').is_file() and not (crashed / 'iter_6.pth').exists()

    resumed = train(config, crashed, '--resume')
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert 'resumed epoch: 0, iter: 4' in resumed.stdout + resumed.stderr
    after = logged_scalars(crashed)
    for it in range(5, ITERS + 1):
        assert after[it]['loss'] == pytest.approx(reference[it], abs=1e-6, rel=0), it
    # the losses moved: equality above is not that of a constant
    assert len({round(reference[it], 6) for it in range(5, ITERS + 1)}) > 1


# Two ranks with their own seeds (seed + rank); the probes record each rank's next draws and,
# at the end, checksums of its weights and optimizer state.
RANK_EXTRA = """
custom_imports = dict(imports=['nala_mm', 'tests.support.rng_probe',
                               'tests.support.state_probe'], allow_failed_imports=False)
custom_hooks = [dict(type='RNGStateHook'), dict(type='RNGProbeHook'), dict(type='StateProbeHook')]
randomness = dict(seed=0, diff_rank_seed=True)
train_dataloader = dict(batch_size=2, num_workers=1, persistent_workers=True,
                        dataset=dict(data_root=data_root))
default_hooks = dict(checkpoint=dict(interval=2), logger=dict(interval=1))
"""
# The same on the epoch-based loop (as the detection configs train): 8 images, 2 ranks, batch 2:
# 2 iterations an epoch.
EPOCH_EXTRA = RANK_EXTRA + """
train_dataloader = dict(batch_size=2, num_workers=1, persistent_workers=True,
                        sampler=dict(type='DefaultSampler', shuffle=True),
                        dataset=dict(data_root=data_root))
train_cfg = dict(_delete_=True, type='EpochBasedTrainLoop', max_epochs=2, val_interval=2)
default_hooks = dict(checkpoint=dict(interval=1, by_epoch=True), logger=dict(interval=1))
param_scheduler = []
"""


def dist_tool(script, *args):
    proc = subprocess.run(['bash', script, *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=600,
                          env=tool_env(PORT=str(free_port()), OMP_NUM_THREADS='1',
                                       PYTHON=PYTHON))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr


def probes(work_dir, rank):
    with open(work_dir / f'rng_probe_rank{rank}.jsonl') as f:
        return {r['iter']: (r['torch'], r['numpy'], r['python']) for r in map(json.loads, f)}


def assert_ranks_hold_the_same_state(work_dir):
    """Weights and optimizer state equal on both ranks; BatchNorm running statistics are the
    one exception by design (mmengine's DDP does not broadcast buffers; on CPU, SyncBN runs as
    per-process BN), so they must differ, or the ranks did not see different data."""
    ranks = [json.loads((work_dir / f'state_rank{rank}.json').read_text()) for rank in (0, 1)]
    assert ranks[0]['params'] and ranks[0]['optimizer']
    assert ranks[0]['params'] == ranks[1]['params']
    assert ranks[0]['optimizer'] == ranks[1]['optimizer']
    running = [name for name in ranks[0]['buffers'] if name.endswith('running_mean')]
    assert running and any(ranks[0]['buffers'][n] != ranks[1]['buffers'][n] for n in running)


def test_two_ranks_train_alike_and_resume_their_own_random_streams(tmp_path, small_ade):
    """diff_rank_seed=True under torchrun: after a resume every rank continues its own stream
    (rank 0 writes the checkpoint, so the other ranks' states must be gathered into it)."""
    config = write_seg_config(tmp_path, small_ade, iters=4, extra=RANK_EXTRA)
    straight = tmp_path / 'straight'
    log = dist_tool('tools/dist_train.sh', config, 2, '--work-dir', straight)
    assert 'Distributed launcher: pytorch' in log and 'Distributed training: True' in log
    assert "dist_cfg: {'backend': 'gloo'}" in log and 'GPU number: 2' in log  # world size
    assert_ranks_hold_the_same_state(straight)
    reference = [probes(straight, rank) for rank in (0, 1)]
    assert all(sorted(r) == [1, 2, 3, 4] for r in reference)
    for it in (1, 3):  # each rank draws its own stream: torch, numpy and python all differ
        assert all(a != b for a, b in zip(reference[0][it], reference[1][it])), it
    saved = load_run_checkpoint(straight / 'iter_2.pth')['rng_state']
    assert saved['world_size'] == 2 and sorted(saved['ranks']) == [0, 1]

    resumed = tmp_path / 'resumed'  # restart from the iteration-2 checkpoint of that run
    log = dist_tool('tools/dist_train.sh', config, 2, '--work-dir', resumed, '--resume',
                    straight / 'iter_2.pth')
    assert 'resumed epoch: 0, iter: 2' in log
    for rank in (0, 1):
        after = probes(resumed, rank)
        assert sorted(after) == [3, 4]
        for it in (3, 4):
            assert after[it] == reference[rank][it], (rank, it)


@pytest.mark.extended
def test_epoch_based_two_rank_run_and_two_process_test_give_the_single_process_miou(
        tmp_path, small_ade):
    config = write_seg_config(tmp_path, small_ade, iters=4, extra=EPOCH_EXTRA)
    work = tmp_path / 'epochs'
    dist_tool('tools/dist_train.sh', config, 2, '--work-dir', work)
    assert_ranks_hold_the_same_state(work)
    for epoch in (1, 2):  # saved after each epoch, with both ranks' generator states
        saved = load_run_checkpoint(work / f'epoch_{epoch}.pth')
        assert saved['meta']['epoch'] == epoch
        assert saved['rng_state']['world_size'] == 2
        assert sorted(saved['rng_state']['ranks']) == [0, 1]

    pattern = r'metrics: aAcc=([\d.]+), mIoU=([\d.]+), mAcc=([\d.]+)'
    single = run_tool('tools/test.py', config, work / 'epoch_2.pth', '--work-dir',
                      tmp_path / 'single')
    double = dist_tool('tools/dist_test.sh', config, work / 'epoch_2.pth', 2, '--work-dir',
                       tmp_path / 'double')
    assert 'Distributed training: True' in double
    # the two ranks' halves of the validation set, gathered, give the same metrics
    assert re.search(pattern, double).groups() == re.search(pattern, single).groups()
