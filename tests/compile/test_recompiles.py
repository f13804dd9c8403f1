"""Compiled inference (nala_mm.apis.compile): the feature extraction of a real segmentor compiled
with dynamic sizes gives eager's predictions at every size, compiles a bounded number of graphs over
a size sequence, and stops with an error at its recompile limit instead of running eager
silently; the state dict is the eager model's. Graph capture through ``backend='eager'``
(dynamo's guards, no code generation): the counts are the ones inductor gets.

The size sequences users meet at full size (benchmarks/lib/recompiles.py; the compile
benchmark's page reports their counts) are bounded beside them, in
benchmarks/tests/test_recompiles.py (make test-extended)."""
import pytest
import torch
from torch import nn

from nala_mm.apis.compile import RECOMPILE_LIMIT, compile_feature_extraction, feature_extractor
from nala_mm.apis.config_loading import build_model_from_config
from nala_mm.apis.data_samples import synthetic_batch
from tests.helpers import DEMO_SEG_CFG

# keep-ratio test sizes of the demo (short side 160), a portrait and a small one
SIZES = [(160, 213), (160, 160), (120, 160), (160, 284), (107, 160)]
# measured: a third graph for an input with a side under the square crop (torch 2.13)
MAX_GRAPHS = 3


def demo_segmentor():
    torch.manual_seed(0)
    model, _ = build_model_from_config(DEMO_SEG_CFG)
    return model


def predict(model, height, width):
    with torch.no_grad():
        return model.test_step(synthetic_batch('mmseg', 1, height, width))[0].seg_logits.data


def test_compiled_predictions_match_eager_with_bounded_graphs():
    torch._dynamo.reset()
    model = demo_segmentor()
    keys = list(model.state_dict())
    eager = {size: predict(model, *size) for size in SIZES}
    compiled = compile_feature_extraction(model, backend='eager')
    counts = []
    for size in SIZES:
        got = predict(model, *size)
        assert got.shape == eager[size].shape
        # compiled, the ops take their reference formulas; eager, the fast nodes
        torch.testing.assert_close(got, eager[size], rtol=1e-4, atol=1e-4)
        counts.append(compiled.compilations)
    assert counts[0] == 1 and counts == sorted(counts)
    assert counts[-1] <= MAX_GRAPHS <= RECOMPILE_LIMIT
    # compiled on the instance: the parameters and their names are the eager model's
    assert list(model.state_dict()) == keys and not any('_orig_mod' in k for k in keys)
    with pytest.raises(RuntimeError, match='compiled already'):
        compile_feature_extraction(model, backend='eager')


def test_the_recompile_limit_raises_instead_of_running_eager():
    torch._dynamo.reset()
    model = demo_segmentor()
    compiled = compile_feature_extraction(model, backend='eager', recompile_limit=1)
    predict(model, 160, 213)
    predict(model, 160, 160)  # the same graph (dynamic sizes)
    with pytest.raises(RuntimeError, match=r'after 1 compilations, and recompile_limit is 1'):
        predict(model, 120, 160)
    assert compiled.compilations == 1
    with pytest.raises(ValueError, match='recompile_limit must be at least 1, got 0'):
        compile_feature_extraction(demo_segmentor(), recompile_limit=0)


def test_wrappers_are_looked_through_and_other_modules_refused():
    model = demo_segmentor()

    class Wrapper(nn.Module):  # as DDP and the TTA models hold the model
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert feature_extractor(Wrapper(Wrapper(model))) is model
    with pytest.raises(TypeError, match='Linear has no extract_feat'):
        feature_extractor(nn.Linear(2, 2))


def test_optimizer_updates_run_eager_inside_a_compiled_train_step():
    """mmengine's compile=True compiles train_step, the update included: made eager on the
    wrapper (as tools/train.py --compile does), the update (on mmengine's ConfigDict param groups,
    which dynamo's optimizer tracing fails on) runs outside the graph, and a learning rate the
    scheduler changes recompiles nothing. The class OptimWrapper is untouched."""
    from mmengine.config import ConfigDict
    from mmengine.optim import OptimWrapper, build_optim_wrapper

    from nala_mm.compat.eager_updates import eager_update_params
    update_params = OptimWrapper.update_params
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 1))
    # a config's optim_wrapper, as the Runner passes it: the param groups become ConfigDicts
    wrapper = build_optim_wrapper(model, ConfigDict(
        optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.01),
        paramwise_cfg=dict(norm_decay_mult=0.0)))
    assert type(wrapper.optimizer.param_groups[0]).__name__ == 'ConfigDict'
    eager_update_params(wrapper)
    assert OptimWrapper.update_params is update_params and 'update_params' in vars(wrapper)
    graphs = []

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def train_step(x):
        loss = model(x).square().mean()
        wrapper.update_params(loss)
        return loss.detach()

    compiled = torch.compile(train_step, backend=counting)
    x = torch.randn(16, 4)
    losses, counts = [], []
    for lr in (1e-2, 5e-3, 2e-3):
        for group in wrapper.optimizer.param_groups:
            group['lr'] = lr
        losses.append(float(compiled(x)))
        counts.append(len(graphs))
    assert losses[2] < losses[1] < losses[0]  # the eager updates took effect
    # the forward with the loss, and the code after the eager update; none per learning rate
    assert counts == [2, 2, 2]
