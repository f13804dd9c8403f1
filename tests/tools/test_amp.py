"""Mixed precision: `--amp` switches a config to bf16 autocast on CPU, a segmentor overfits a fixed
batch under it as under fp32, and NaLa's attention math stays float32 inside it."""
import math

import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

from nala_mm.apis.config_loading import load_config
from nala_mm.engine.optimizers import enable_amp
from nala_mm.models import NormAwareLinearAttention
from tests.helpers import DEMO_SEG_CFG, logged_scalars, run_tool, write_seg_config

STEPS = 20
SIZE = (64, 64)


def overfit(cfg, batch, amp: bool):
    """``STEPS`` optimizer steps of the demo segmentor on one fixed batch; the losses."""
    from mmseg.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    wrapper_cfg = cfg.optim_wrapper.copy()
    if amp:
        holder = cfg.copy()
        enable_amp(holder)
        wrapper_cfg = holder.optim_wrapper
    wrapper = build_optim_wrapper(model, wrapper_cfg)
    losses = []
    for _ in range(STEPS):
        with wrapper.optim_context(model):
            data = model.data_preprocessor(batch, True)
            loss, _ = model.parse_losses(model(**data, mode='loss'))
        wrapper.update_params(loss)
        losses.append(loss.item())
    return losses, type(wrapper).__name__


def test_bf16_overfits_a_fixed_batch_like_fp32(small_ade):
    from mmseg.registry import DATASETS
    cfg = load_config(DEMO_SEG_CFG)
    init_default_scope('mmseg')
    # two training images, resized (no random crop or flip: one fixed batch), at a small size
    cfg.model.data_preprocessor.size = SIZE
    pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=SIZE, keep_ratio=False),
                dict(type='LoadAnnotations', reduce_zero_label=True), dict(type='PackSegInputs')]
    dataset = DATASETS.build(dict(cfg.train_dataloader.dataset, data_root=str(small_ade),
                                  pipeline=pipeline))
    batch = pseudo_collate([dataset[0], dataset[1]])
    fp32, fp32_wrapper = overfit(cfg, batch, amp=False)
    bf16, bf16_wrapper = overfit(cfg, batch, amp=True)
    assert (fp32_wrapper, bf16_wrapper) == ('OptimWrapper', 'BF16AutocastOptimWrapper')
    assert all(math.isfinite(v) for v in bf16)
    # both learn the batch: the loss ends far below where it started ...
    assert fp32[-1] < 0.5 * fp32[0] and bf16[-1] < 0.5 * bf16[0]
    # ... bf16 really computed in another precision (the trajectories are not identical) ...
    assert bf16 != fp32
    # ... and follows fp32's: same start, an end within 15 % (measured: a few %)
    assert bf16[0] == pytest.approx(fp32[0], rel=0.02)
    assert bf16[-1] == pytest.approx(fp32[-1], rel=0.15)


@pytest.mark.extended
@pytest.mark.integration
def test_amp_flag_of_the_train_tool_trains_in_bf16(tmp_path, tiny_ade):
    config = write_seg_config(tmp_path, tiny_ade, iters=2)
    log = run_tool('tools/train.py', config, '--amp', '--work-dir', tmp_path / 'amp')
    assert 'BF16AutocastOptimWrapper' in log
    losses = logged_scalars(tmp_path / 'amp')
    assert sorted(losses) == [1, 2] and all(math.isfinite(r['loss']) for r in losses.values())


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
