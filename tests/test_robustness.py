"""Robustness: AMP without NaN, kill -9 then resume to identical losses, atomic checkpoints,
hostile inputs through the segmentor and the attention layer."""
import glob
import json
import math
import os
import os.path as osp
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mmengine.fileio.backends import LocalBackend
from mmengine.registry import init_default_scope
from PIL import Image

from nala_mm.datasets.synthetic_ade import generate_ade_like
from nala_mm.hooks import select_rng_state
from nala_mm.models import NormAwareLinearAttention
from nala_mm.ops import NaLaConfig, nala_attention, nala_attention_reference, rope_table
from nala_mm.runtime import load_config
from tests.test_segmentation import REPO, TINY_CFG

DEMO_CFG = osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py')


@pytest.fixture(scope='module')
def small_ade(tmp_path_factory):
    root = tmp_path_factory.mktemp('ade') / 'ADEChallengeData2016'
    generate_ade_like(str(root), num_train=8, num_val=2, image_size=(96, 96), progress=False)
    return root


def write_config(directory, root, iters, extra=''):
    """TINY_CFG on ``root``; ``extra`` re-assigning a dict replaces it whole, so it must repeat
    the data root (else the demo's default root would be used)."""
    path = directory / f'cfg_{iters}.py'
    path.write_text(TINY_CFG.format(base=DEMO_CFG, root=root, iters=iters) + extra)
    return str(path)


def scalars(work_dir):
    """Per-iteration training losses from the LocalVisBackend's scalars.json (full precision)."""
    losses = {}
    for path in sorted(glob_scalars(work_dir)):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if 'loss' in record and 'iter' in record:
                    losses[record['iter']] = record['loss']
    return losses


def glob_scalars(work_dir):
    return glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))


# Deterministic and exactly logged: window 1 (no smoothing), one data worker (seeded per worker,
# so the resumed dataloader replay is exact), DropPath on to exercise the RNG-state hook.
CRASH_EXTRA = """
randomness = dict(seed=0, deterministic=True)
log_processor = dict(window_size=1)
train_dataloader = dict(batch_size=2, num_workers=1, persistent_workers=True,
                        dataset=dict(data_root=data_root))
default_hooks = dict(checkpoint=dict(interval=4, max_keep_ckpts=3), logger=dict(interval=1))
model = dict(backbone=dict(drop_path_rate=0.3))
"""


def train_cmd(config, work_dir, *extra):
    return [sys.executable, 'tools/train.py', config, '--work-dir', str(work_dir), *extra]


def env():
    return dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS='ignore')


def test_sigkill_then_resume_continues_with_identical_losses(tmp_path, small_ade):
    config = write_config(tmp_path, small_ade, iters=12, extra=CRASH_EXTRA)
    straight = tmp_path / 'straight'
    subprocess.run(train_cmd(config, straight), cwd=REPO, env=env(), check=True,
                   capture_output=True, timeout=600)
    reference = scalars(straight)
    assert sorted(reference) == list(range(1, 13))

    crashed = tmp_path / 'crashed'
    proc = subprocess.Popen(train_cmd(config, crashed), cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    # kill between checkpoints: iteration 6 is logged, the next checkpoint is at 8
    while time.time() < deadline and proc.poll() is None:
        if glob_scalars(crashed) and 6 in scalars(crashed):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = scalars(crashed)
    assert 6 in before and 12 not in before
    assert (crashed / 'iter_4.pth').is_file() and not (crashed / 'iter_12.pth').exists()

    result = subprocess.run(train_cmd(config, crashed, '--resume'), cwd=REPO, env=env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'resumed epoch: 0, iter: 4' in result.stdout + result.stderr
    after = scalars(crashed)
    for it in range(5, 13):
        assert after[it] == pytest.approx(reference[it], abs=1e-6, rel=0), it


# Two ranks with their own seeds (seed + rank); the probe records each rank's next draws.
RANK_EXTRA = """
custom_imports = dict(imports=['nala_mm', 'tests._rng_probe'], allow_failed_imports=False)
custom_hooks = [dict(type='RNGStateHook'), dict(type='RNGProbeHook')]
randomness = dict(seed=0, diff_rank_seed=True)
train_dataloader = dict(batch_size=2, num_workers=1, persistent_workers=True,
                        dataset=dict(data_root=data_root))
default_hooks = dict(checkpoint=dict(interval=2), logger=dict(interval=1))
"""


def probes(work_dir, rank):
    with open(osp.join(work_dir, f'rng_probe_rank{rank}.jsonl')) as f:
        return {r['iter']: (r['torch'], r['numpy'], r['python'])
                for r in map(json.loads, f)}


def free_port() -> int:
    """A port nothing listens on now (so parallel test runs do not collide on a fixed one)."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def dist_train(config, work_dir, *extra):
    proc = subprocess.run(
        ['bash', 'tools/dist_train.sh', config, '2', '--work-dir', str(work_dir), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(env(), PORT=str(free_port()), OMP_NUM_THREADS='1', PYTHON=sys.executable))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr


def test_two_ranks_resume_their_own_random_streams(tmp_path, small_ade):
    """diff_rank_seed=True under torchrun: after a resume every rank continues its own stream
    (rank 0 writes the checkpoint, so the other ranks' states must be gathered into it)."""
    config = write_config(tmp_path, small_ade, iters=4, extra=RANK_EXTRA)
    straight = tmp_path / 'straight'
    dist_train(config, straight)
    reference = [probes(straight, rank) for rank in (0, 1)]
    assert all(sorted(r) == [1, 2, 3, 4] for r in reference)
    for it in (1, 3):  # each rank draws its own stream: torch, numpy and python all differ
        assert all(a != b for a, b in zip(reference[0][it], reference[1][it])), it
    saved = torch.load(straight / 'iter_2.pth', map_location='cpu')['rng_state']
    assert saved['world_size'] == 2 and sorted(saved['ranks']) == [0, 1]

    resumed = tmp_path / 'resumed'  # restart from the iteration-2 checkpoint of that run
    log = dist_train(config, resumed, '--resume', str(straight / 'iter_2.pth'))
    assert 'resumed epoch: 0, iter: 2' in log
    for rank in (0, 1):
        after = probes(resumed, rank)
        assert sorted(after) == [3, 4]
        for it in (3, 4):
            assert after[it] == reference[rank][it], (rank, it)


def _rank_states(count):
    return {rank: dict(tag=rank) for rank in range(count)}


def test_rng_states_after_a_world_size_change_stay_distinct_and_warn():
    saved = dict(world_size=2, ranks=_rank_states(2))
    assert select_rng_state(saved, 1, 2, shared_stream=False) == (dict(tag=1), None)
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
    # a checkpoint from before per-rank states (one state, no ranks) still resumes one process
    legacy = dict(torch=1, numpy=2, python=3)
    assert select_rng_state(legacy, 0, 1, shared_stream=False) == (legacy, None)
    state, warning = select_rng_state(legacy, 1, 2, shared_stream=False)
    assert state is None and 'ranks [1]' in warning


def test_kill_during_save_never_leaves_a_truncated_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / 'iter_8.pth'
    backend = LocalBackend()
    backend.put(b'complete old checkpoint', target)

    def killed(*args, **kwargs):  # the process dies after writing, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, 'replace', killed)
    with pytest.raises(KeyboardInterrupt):
        backend.put(b'new bytes that never fully land', target)
    assert target.read_bytes() == b'complete old checkpoint'
    assert not [p for p in os.listdir(tmp_path) if 'partial' in p]


AMP_EXTRA = """
crop_size = (64, 64)
model = dict(data_preprocessor=dict(size=crop_size))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomCrop', crop_size=crop_size),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=1000))
optim_wrapper = dict(optimizer=dict(lr=2e-3))
param_scheduler = []
"""


def run_amp_training(tmp_path, root, iters):
    config = write_config(tmp_path, root, iters=iters, extra=AMP_EXTRA)
    out = subprocess.run(train_cmd(config, tmp_path / 'amp', '--amp'), cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-2000:]
    log = out.stdout + out.stderr
    assert 'BF16AutocastOptimWrapper' in log or 'AmpOptimWrapper' in log
    losses = scalars(tmp_path / 'amp')
    assert set(range(10, iters + 1, 10)) <= set(losses)  # logged every 10 (and epoch ends)
    assert all(math.isfinite(v) for v in losses.values())
    return losses


def test_amp_trains_200_iterations_without_nan(tmp_path, small_ade):
    losses = run_amp_training(tmp_path, small_ade, iters=200)
    assert losses[200] < losses[10]  # it learned under bf16


def test_amp_forward_keeps_attention_math_in_float32():
    layer = NormAwareLinearAttention(16, 1)
    seen = []
    original = layer.mix

    def spy(q, k, v, rope):
        seen.append((q.dtype, torch.is_autocast_enabled('cpu')))
        return original(q, k, v, rope)

    layer.mix = spy
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = layer(torch.randn(1, 6, 6, 16))  # channels-last tokens
    assert seen == [(torch.float32, False)]
    assert out.dtype == torch.bfloat16


@pytest.fixture(scope='module')
def segmentor():
    cfg = load_config(DEMO_CFG)
    init_default_scope('mmseg')
    from mmseg.registry import MODELS
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model.eval()


@pytest.mark.parametrize('height, width', [(17, 23), (64, 2048), (2048, 64), (1, 1)])
def test_segmentor_handles_tiny_and_extreme_shapes(segmentor, height, width):
    from mmseg.structures import SegDataSample
    image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8)
    sample = SegDataSample(metainfo=dict(ori_shape=(height, width), img_shape=(height, width),
                                         pad_shape=(height, width)))
    data = segmentor.data_preprocessor(dict(inputs=[image], data_samples=[sample]), False)
    with torch.no_grad():
        result = segmentor.predict(data['inputs'], data['data_samples'])[0]
    logits = result.seg_logits.data
    assert tuple(logits.shape[-2:]) == (height, width)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize('mode', ['L', 'RGBA', 'LA', 'P'])
def test_pipeline_reads_grayscale_rgba_and_palette_images(tmp_path, small_ade, mode):
    cfg = load_config(write_config(tmp_path, small_ade, iters=1))
    init_default_scope('mmseg')
    from mmengine.dataset import Compose
    pipeline = Compose(cfg.test_pipeline)
    source = Image.open(small_ade / 'images' / 'validation' / 'ADE_val_00000000.jpg')
    path = tmp_path / f'image_{mode}.png'
    source.convert(mode).save(path)
    seg = small_ade / 'annotations' / 'validation' / 'ADE_val_00000000.png'
    result = pipeline(dict(img_path=str(path), seg_map_path=str(seg), reduce_zero_label=True,
                           seg_fields=[], label_map=None))
    assert result['inputs'].shape[0] == 3  # always three channels for the model


@pytest.mark.parametrize('scale', [1e4, 1.0, 1e-8, 0.0])
def test_attention_layer_is_finite_at_extreme_magnitudes(scale):
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(32, 2, kernel='cosine')
    x = (torch.randn(2, 7, 9, 32) * scale).requires_grad_()  # channels-last tokens
    out = layer(x)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


@settings(max_examples=40, deadline=None)
@given(height=st.integers(1, 9), width=st.integers(1, 9), heads=st.sampled_from([1, 2]),
       log_scale=st.floats(-8, 4), kernel=st.sampled_from(['cosine', 'relu']),
       seed=st.integers(0, 2 ** 16))
def test_property_attention_finite_and_fast_equals_reference(height, width, heads, log_scale,
                                                             kernel, seed):
    gen = torch.Generator().manual_seed(seed)
    head_dim = 8
    shape = (1, heads, height * width, head_dim)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) * 10 ** log_scale
               for _ in range(3))
    rope = tuple(t.double() for t in rope_table(height, width, head_dim))
    cfg = NaLaConfig(kernel=kernel)
    fast = nala_attention(q, k, v, cfg, rope)
    assert torch.isfinite(fast).all()
    reference = nala_attention_reference(q, k, v, cfg, rope)
    assert torch.allclose(fast, reference, rtol=1e-7, atol=1e-7 * float(v.abs().max()))
