"""NaLaFormer as an mmpretrain ImageClassifier: the authors' checkpoints load through the Runner
(AuthorsCheckpointHook) and give the released model's logits, checked against the independent
transcription of the released classifier (tests/reference/released_nalaformer.py); what does not
fit is refused with every problem named."""
import argparse
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from nala_mm import compat
from nala_mm.models.classifier import NaLaFormerClsNeck, classifier_state_dict
from tests.configs.test_configs import load
from tests.helpers import REPO, rel_err
from tests.helpers import TINY_ARCH as TINY
from tests.models.test_pretrained import released_model
from tests.support.pretrain import requires_mmpretrain

pytestmark = requires_mmpretrain


@pytest.fixture(autouse=True)
def with_compat():
    """The Runner loads the authors' files (``load_from``) before the hook converts them: under
    the host changes the project's tools install (their ``argparse.Namespace`` allow-listed)."""
    with compat.installed():
        yield

T_CONFIG = osp.join(REPO, 'configs', 'imagenet', 'nalaformer-t_8xb128-300e_in1k.py')


def authors_file(path, model, ema=None) -> str:
    """An authors' training checkpoint: DeiT's keys, their command line as the Namespace their
    main.py saves (their optimizer state stands in as a dict)."""
    content = {'model': model.state_dict(), 'optimizer': {'state': {}, 'param_groups': []},
               'epoch': 299, 'max_accuracy': 80.0,
               'args': argparse.Namespace(model='NaLaFormer_T', lr=1e-3, epochs=300)}
    if ema is not None:
        content['model_ema'] = ema.state_dict()
    torch.save(content, path)
    return str(path)


def classifier_config(arch=None, num_classes: int = 1000) -> Config:
    """The T ImageNet config, optionally with another arch and number of classes."""
    cfg = load(T_CONFIG)
    if arch is not None:
        cfg.model.backbone.arch = arch
        cfg.model.neck.in_channels = arch['embed_dims'][-1]
    cfg.model.head.num_classes = num_classes
    return cfg


def runner_that_loaded(cfg: Config, path: str, work_dir) -> Runner:
    """A Runner of the config's model and hooks, through ``before_run`` and the loading of
    ``path`` (the sequence of ``Runner.test``)."""
    runner = Runner(model=dict(cfg.model, data_preprocessor=cfg.data_preprocessor),
                    work_dir=str(work_dir), custom_hooks=cfg.custom_hooks,
                    default_scope='mmpretrain', load_from=path)
    runner.call_hook('before_run')
    runner.load_checkpoint(path)
    return runner


def logits(model, image):
    with torch.no_grad():
        return model.eval()(image, mode='tensor') if hasattr(model, 'extract_feat') \
            else model.eval()(image)


def ema_model(runner):
    hook, = [h for h in runner.hooks if type(h).__name__ == 'EMAHook']
    return hook.ema_model.module


@pytest.mark.extended  # a full-size NaLaFormer-T twice at 224 (about 20 s here)
def test_authors_nalaformer_t_checkpoint_gives_the_released_logits_and_ema(tmp_path):
    """The config as shipped, loading an authors' NaLaFormer-T file with 'model' and 'model_ema'
    (different weights): the model holds 'model', the EMA hook's model 'model_ema', each with
    the released logits."""
    released, released_ema = released_model('t', seed=0), released_model('t', seed=1)
    released.head = torch.nn.Conv2d(1024, 1000, 1)  # an ImageNet-1K head (the default is 10)
    released_ema.head = torch.nn.Conv2d(1024, 1000, 1)
    path = authors_file(tmp_path / 'nalaformer_t.pth', released, released_ema)
    runner = runner_that_loaded(classifier_config(), path, tmp_path / 'work')
    image = torch.randn(2, 3, 224, 224)
    ours, reference = logits(runner.model, image), logits(released, image)
    assert ours.shape == (2, 1000)
    assert rel_err(ours, reference) <= 1e-4
    ours_ema, reference_ema = logits(ema_model(runner), image), logits(released_ema, image)
    assert rel_err(ours_ema, reference_ema) <= 1e-4
    assert rel_err(reference, reference_ema) > 0.1  # two different models were told apart


@pytest.mark.parametrize('size', [(64, 64), (61, 77)], ids=['square', 'odd'])
def test_tiny_authors_checkpoint_without_ema_at_any_size(tmp_path, size):
    """A file without 'model_ema': its 'model' weights go to the model and to the EMA hook."""
    released = released_model(TINY, seed=3)
    path = authors_file(tmp_path / 'tiny.pth', released)
    runner = runner_that_loaded(classifier_config(TINY, num_classes=10), path, tmp_path / 'w')
    image = torch.randn(2, 3, *size)
    reference = logits(released, image)
    assert rel_err(logits(runner.model, image), reference) <= 1e-5
    assert rel_err(logits(ema_model(runner), image), reference) <= 1e-5


def test_the_tail_maps_onto_the_neck_and_the_linear_head():
    released = released_model(TINY)
    cfg = classifier_config(TINY, num_classes=10)
    from nala_mm.apis.config_loading import build_model
    model = build_model(cfg)
    state = classifier_state_dict(released.state_dict(), model)
    assert isinstance(model.neck, NaLaFormerClsNeck)
    assert torch.equal(state['head.fc.weight'], released.head.weight.flatten(1))
    assert torch.equal(state['neck.norm.running_var'], released.norm.running_var)
    assert torch.equal(state['neck.proj.weight'], released.proj.weight)
    assert not any('RoPE' in key for key in state)  # checked, not loaded
    assert sorted(state) == sorted(model.state_dict())  # every tensor of the classifier


def test_a_checkpoint_that_does_not_fit_is_refused_naming_every_problem(tmp_path):
    released = released_model(TINY)
    path = authors_file(tmp_path / 'tiny.pth', released)
    # another number of classes and another variant's widths in stage 4
    other = dict(TINY, embed_dims=(16, 32, 48, 96))
    cfg = classifier_config(other, num_classes=5)
    with pytest.raises(ValueError) as error:
        runner_that_loaded(cfg, path, tmp_path / 'w')
    message = str(error.value)
    assert 'tiny.pth' in message and "['model']" in message
    assert 'head.fc.weight (10, 1024) vs model (5, 1024)' in message
    assert 'neck.proj.weight (1024, 64) vs model (1024, 96)' in message
    assert 'layers.2.downsample.reduction.weight (64, 48, 3, 3) vs model (96, 48, 3, 3)' \
        in message


def test_resuming_from_an_authors_checkpoint_is_refused(tmp_path):
    released = released_model(TINY)
    path = authors_file(tmp_path / 'tiny.pth', released)
    cfg = classifier_config(TINY, num_classes=10)
    runner = Runner(model=dict(cfg.model, data_preprocessor=cfg.data_preprocessor),
                    work_dir=str(tmp_path / 'w'), custom_hooks=cfg.custom_hooks,
                    default_scope='mmpretrain', load_from=path, resume=True)
    runner.call_hook('before_run')
    with pytest.raises(ValueError, match=r"is an authors' checkpoint .* cannot resume an "
                                         r'mmengine run\. Load it instead'):
        runner.load_checkpoint(path)


def test_neck_refuses_a_map_of_the_wrong_width():
    neck = NaLaFormerClsNeck(in_channels=64)
    with pytest.raises(ValueError, match=r'expects a \(B, 64, H, W\) map .* got \(2, 32, 7, 7\)'):
        neck((torch.randn(2, 32, 7, 7),))
    with pytest.raises(ValueError, match=r'in_channels must be a positive integer, got 0'):
        NaLaFormerClsNeck(in_channels=0)
