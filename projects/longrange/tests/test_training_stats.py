"""MixerStatsHook: the statistics it logs are the mixer's, from the iteration it watched, and
they reach scalars.json through a real Runner."""
import json
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from nala_mm.models import NaLaFormer, NormAwareLinearAttention
from projects.longrange.training_stats import MixerStatsHook, series_mean

TINY = dict(embed_dims=(16, 32, 32, 32), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2),
            mlp_ratios=(2, 2, 2, 2))
LAYER = 'layers.0.blocks.0.attn'
REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / 'projects' / 'longrange' / 'configs' / 'ade20k_longrange_segformer.py'


def test_gradient_norm_and_exponent_are_the_watched_iterations():
    torch.manual_seed(0)
    model = NaLaFormer(arch=TINY, mixers=[dict(type='NormAwareLinearAttention',
                                               kernel='cosine')] * 4)
    hook = MixerStatsHook([LAYER], interval=1, rows=64)
    hook.attach(model)
    layer = dict(model.named_modules())[LAYER]
    seen = {}
    layer.register_forward_hook(lambda m, a, o: seen.update(x=a[0].detach()))  # returns None
    hook.watch()
    sum(o.sum() for o in model(torch.randn(2, 3, 48, 64))).backward()
    stats = hook.collect()[LAYER]
    # independently: the norm of the gradients autograd left in the layer's parameters
    expected = torch.sqrt(sum(p.grad.square().sum() for p in layer.parameters()
                              if p.grad is not None))
    assert stats['grad_norm'] == pytest.approx(float(expected), rel=1e-5)
    # the mean query norm and exponent of the first sample, recomputed from the layer's input
    q = layer.project(seen['x'][:1])[0]
    qnorm = q[0].norm(dim=-1)
    assert stats['qnorm'] == pytest.approx(float(qnorm.mean()), rel=1e-5)
    assert stats['exponent'] == pytest.approx(float(layer.query_exponent(qnorm.double()).mean()),
                                              rel=1e-6)
    assert 0.0 <= stats['saturated'] <= 1.0
    assert 0.0 < stats['negative'] < 1.0  # the cosine-inhibit map gives signed weights
    # not watching: nothing accumulates
    model.zero_grad()
    sum(o.sum() for o in model(torch.randn(2, 3, 48, 64))).backward()
    assert hook.collect() == {}


def test_softmax_rows_are_never_negative_and_have_no_exponent():
    torch.manual_seed(0)
    model = NaLaFormer(arch=TINY, mixers=['softmax'] * 4)
    hook = MixerStatsHook([LAYER], interval=1)
    hook.attach(model)
    hook.watch()
    sum(o.sum() for o in model(torch.randn(2, 3, 48, 64))).backward()
    stats = hook.collect()[LAYER]
    assert stats['negative'] == 0.0 and stats['exponent'] is None and stats['grad_norm'] > 0


def test_a_name_that_is_not_a_mixer_is_refused_by_name():
    model = NaLaFormer(arch=TINY)
    with pytest.raises(ValueError, match=r"\['layers.0.norm'\] are not token mixers"):
        MixerStatsHook(['layers.0.norm']).attach(model)
    with pytest.raises(ValueError, match='interval=0'):
        MixerStatsHook([LAYER], interval=0)
    assert isinstance(dict(model.named_modules())[LAYER], NormAwareLinearAttention)


@pytest.mark.integration
def test_scalars_reach_scalars_json_through_the_runner(tmp_path):
    """The long-range config for 4 iterations on a few generated images, stats every 2."""
    from projects.longrange.data import generate_longrange
    root = tmp_path / 'ADEChallengeData2016'
    generate_longrange(str(root), num_train=8, num_val=2, progress=False)
    cfg = Config.fromfile(str(CONFIG))
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = str(root)
        cfg[loader].num_workers, cfg[loader].persistent_workers = 0, False
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=4, val_interval=4)
    cfg.param_scheduler = []
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=2)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=4)
    cfg.custom_hooks = [dict(type='MixerStatsHook', layers=['backbone.' + LAYER], interval=2)]
    cfg.work_dir = str(tmp_path / 'work')
    # a visualizer of its own: mmseg's runtime names it 'visualizer', and mmengine hands back an
    # existing instance of that name (an earlier test's, writing to that test's folder)
    cfg.visualizer.name = f'visualizer-{tmp_path.name}'
    runner = Runner.from_cfg(cfg)
    runner.train()
    # the file this run's visualizer writes (wherever an earlier instance of the name put it)
    written = runner.visualizer.get_backend('LocalVisBackend')._scalar_save_file
    scalars = [json.loads(line) for line in open(written).read().splitlines()]
    logged = [r for r in scalars if f'mixer/backbone.{LAYER}/grad_norm' in r]
    assert [r['step'] for r in logged] == [2, 4]
    assert all(r[f'mixer/backbone.{LAYER}/grad_norm'] > 0 for r in logged)
    assert all(0 <= r[f'mixer/backbone.{LAYER}/saturated'] <= 1 for r in logged)


def test_series_mean_over_the_early_steps_or_the_last_ones():
    records = [dict(iter=25, loss=0.8, grad_norm=1.0), dict(iter=50, loss=0.6),
               dict(iter=75, loss=0.4, grad_norm=3.0), dict(iter=100, loss=0.2, grad_norm=None)]
    assert series_mean(records, 'loss', until=50) == pytest.approx(0.7)
    assert series_mean(records, 'loss', last=3) == pytest.approx(0.4)
    assert series_mean(records, 'grad_norm') == pytest.approx(2.0)  # absent and None skipped
    assert series_mean(records, 'grad_norm', until=10) is None
    assert series_mean(records, 'exponent') is None
    with pytest.raises(ValueError, match=r'give until \(50\) or last \(2\), not both'):
        series_mean(records, 'loss', until=50, last=2)
