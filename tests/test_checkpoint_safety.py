"""Foundation: with nala_mm.compat, Runner checkpoints resume under weights-only loading (which
stays on) and are written atomically; without it (the suite's default) mmengine 0.10.7's resume
fails under torch >= 2.6; configs find nala_mm."""
import contextlib
import os
import pickle

import pytest
import torch
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.registry import MODELS, DefaultScope
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader
from torch import nn
from torch.utils.data import Dataset

import nala_mm
from nala_mm import compat
from nala_mm.compat.atomic_checkpoints import BACKEND, AtomicLocalBackend


class LinearRegressor(BaseModel):
    """Fits y = x1 + x2; enough for the Runner to log, checkpoint and schedule."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1)

    def forward(self, x, y, mode='loss'):
        return dict(loss=((self.fc(torch.stack(x)) - torch.stack(y)) ** 2).mean())


class SumDataset(Dataset):

    def __len__(self):
        return 32

    def __getitem__(self, index):
        x = torch.randn(2, generator=torch.Generator().manual_seed(index))
        return dict(x=x, y=x.sum(0, keepdim=True))


def make_runner(work_dir, max_iters, resume=False, backend_args=None):
    torch.manual_seed(0)  # the model is built before the Runner seeds anything
    return Runner(
        model=LinearRegressor(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=SumDataset(), batch_size=4,
                              collate_fn=dict(type='pseudo_collate'),
                              sampler=dict(type='InfiniteSampler', shuffle=True)),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.05)),
        param_scheduler=[dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=5),
                         dict(type='PolyLR', by_epoch=False, begin=5, end=40, eta_min=0)],
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=5, by_epoch=False,
                                           backend_args=backend_args),
                           logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=0), resume=resume, experiment_name=f'run{max_iters}{resume}')


def test_without_compat_a_runner_checkpoint_is_refused_under_weights_only_loading(tmp_path):
    """The suite runs unpatched: mmengine 0.10.7 saves the message hub's HistoryBuffer with its
    own pickle, and its loader (torch >= 2.6: weights-only) refuses it."""
    make_runner(tmp_path, max_iters=5).train()
    with pytest.raises(pickle.UnpicklingError,
                       match='GLOBAL mmengine.logging.history_buffer.HistoryBuffer'):
        CheckpointLoader.load_checkpoint(str(tmp_path / 'iter_5.pth'))


def test_runner_checkpoint_resumes_under_weights_only_loading(tmp_path):
    with compat.installed():
        resumes_exactly(tmp_path)


def resumes_exactly(tmp_path):
    first = make_runner(tmp_path, max_iters=10, backend_args=dict(backend=BACKEND))
    first.train()
    checkpoint_hook = next(h for h in first.hooks if type(h).__name__ == 'CheckpointHook')
    assert type(checkpoint_hook.file_backend) is AtomicLocalBackend  # the tools' choice
    weights_at_10 = first.model.fc.weight.detach().clone()
    # the file holds a message hub with HistoryBuffers, yet needs no unsafe global
    assert torch.serialization.get_unsafe_globals_in_checkpoint(
        str(tmp_path / 'iter_10.pth')) == []  # all allow-listed
    loaded = CheckpointLoader.load_checkpoint(str(tmp_path / 'iter_10.pth'))
    assert loaded['meta']['iter'] == 10
    assert loaded['message_hub']['log_scalars']['train/loss'].current() > 0

    second = make_runner(tmp_path, max_iters=20, resume=True)
    second.train()
    log = open(second.log_dir + f'/{second.timestamp}.log').read()
    assert 'resumed epoch: 0, iter: 10' in log
    assert second.iter == 20
    assert not torch.equal(second.model.fc.weight, weights_at_10)  # it kept training
    assert os.path.isfile(tmp_path / 'iter_20.pth')
    # and it continued exactly where it stopped: same weights as 20 uninterrupted iterations
    straight = make_runner(tmp_path / 'straight', max_iters=20)
    straight.train()
    assert torch.allclose(second.model.fc.weight, straight.model.fc.weight, rtol=0, atol=1e-7)
    assert second.optim_wrapper.get_lr()['lr'][0] == \
        pytest.approx(straight.optim_wrapper.get_lr()['lr'][0])


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


@pytest.mark.parametrize('with_compat', [False, True])
def test_checkpoint_with_arbitrary_object_is_refused(tmp_path, with_compat):
    """mmengine's own loader, weights-only: the allow-list opens nothing that runs code."""
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {'w': torch.zeros(2)}, 'meta': _Exploit(marker)}, path)
    with compat.installed() if with_compat else contextlib.nullcontext():
        with pytest.raises(pickle.UnpicklingError, match=r'GLOBAL (posix|os)\.system'):
            CheckpointLoader.load_checkpoint(str(path))
    assert not marker.exists()


@pytest.mark.parametrize('scope', ['mmseg', 'mmdet'])
def test_config_with_custom_imports_builds_nalaformer(tmp_path, scope):
    cfg_file = tmp_path / f'{scope}_cfg.py'
    cfg_file.write_text(
        "custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)\n"
        f"default_scope = '{scope}'\n"
        "model = dict(type='NaLaFormer', arch='xt',\n"
        "             mixers=(dict(type='NormAwareLinearAttention', kernel='relu'),) * 4)\n")
    cfg = Config.fromfile(str(cfg_file))
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model)
    assert isinstance(model, nala_mm.NaLaFormer)
    assert model.layers[3].blocks[0].attn.cfg.kernel == 'relu'


def test_kill_during_save_never_leaves_a_truncated_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / 'iter_8.pth'
    backend = AtomicLocalBackend()
    backend.put(b'complete old checkpoint', target)

    def killed(*args, **kwargs):  # the process dies after writing, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, 'replace', killed)
    with pytest.raises(KeyboardInterrupt):
        backend.put(b'new bytes that never fully land', target)
    with pytest.raises(KeyboardInterrupt):  # last_checkpoint, too
        backend.put_text('new text', target)
    assert target.read_bytes() == b'complete old checkpoint'
    assert not [p for p in os.listdir(tmp_path) if 'partial' in p]
