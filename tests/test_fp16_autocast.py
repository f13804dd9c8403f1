"""fp16 autocast on CPU, the nearest stand-in here for the GPU's fp16 path (mmengine's
``AmpOptimWrapper``, what ``--amp`` runs on a GPU), beyond what the contract suite holds every
mixer and backbone family to (tests/contracts: finite and close to float32 under fp16 and bf16):
keys whose cubes pass fp16's range, and a segmentation training step through both heads.

CPU fp16 kernels round and accumulate differently from a GPU's (on a GPU, matmuls accumulate in
float32 in tensor cores), so this checks the dtype handling, the ranges and the float32 islands
of the code (NaLa's ``k^3`` and per-token power run in float32 under autocast), not the GPU's
exact numbers.

Detection stays out: mmcv's CPU NMS and RoIAlign reject Half tensors ("not implemented for
'Half'"), a limit of mmcv's CPU kernels and not of the GPU path, where both have fp16 kernels.
"""
import copy

import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.registry import init_default_scope

from nala_mm.apis.config_loading import load_config
from nala_mm.models import NormAwareLinearAttention
from tests.helpers import DEMO_SEG_CFG, rel_err

FP16 = dict(device_type='cpu', dtype=torch.float16)
# fp16 has a 10-bit mantissa (2^-11 = 4.9e-4 per rounding); a layer's output stays within a few
# 1e-3 of float32
LAYER_TOL = 5e-3


def test_nala_keeps_large_keys_finite_under_fp16_where_plain_fp16_math_overflows():
    """Keys of norm ~40 (trained models reach such norms): k^3 passes fp16's 65504, so NaLa's
    float32 island is what keeps the output finite."""
    mixer = NormAwareLinearAttention(64, 2, kernel='relu')
    x = 40 * torch.randn(1, 8, 8, 64)
    with torch.no_grad():
        expected = mixer(x)
        with torch.autocast(**FP16):
            actual = mixer(x)
        k = mixer.qkvg(x.flatten(1, 2)).chunk(4, -1)[1]
    assert k.abs().max() ** 3 > torch.finfo(torch.float16).max  # the case is a real one
    assert torch.isfinite(actual).all()
    assert rel_err(actual.float(), expected) < LAYER_TOL


def _groups(names):
    """Parameter names by part: the stem, the stages, the output norms, each head."""
    groups = {}
    for name in names:
        parts = name.split('.')
        key = '.'.join(parts[:2]) if parts[0] == 'backbone' else parts[0]
        groups.setdefault(key.rstrip('0123456789'), []).append(name)
    return groups


def test_segmentation_demo_training_step_under_fp16_autocast(tiny_ade):
    """One training step of the demo segmentor (UperNet + NaLaFormer, both heads) under fp16
    autocast, as the GPU's AmpOptimWrapper runs it: losses and gradients finite, the loss that of
    float32, and the gradients as close to a float64 step as fp16's precision allows.

    The bound is relative to float32's own error against float64, part by part: fp16 rounds
    2^13 times coarser than float32, so an fp16 step computed correctly deviates from float64
    by about 2^13 times what float32 does (measured: 0.15 to 1.6 times that). The backbone of
    this tiny network is ill-conditioned (conv weights ahead of batch statistics over few
    pixels: even float32 is 1e-4 off float64 there), so there the bound is loose and the
    cosine of the whole update is what holds it; a dtype or range bug (a 16-bit overflow, a
    mixed-dtype backward) turns the update and fails that."""
    from mmseg.registry import DATASETS, MODELS
    cfg = load_config(DEMO_SEG_CFG)
    init_default_scope('mmseg')
    size = (128, 128)
    cfg.model.data_preprocessor.size = size
    # no random masks: the three steps see the same network
    cfg.model.backbone.drop_path_rate = 0.0
    cfg.model.decode_head.dropout_ratio = cfg.model.auxiliary_head.dropout_ratio = 0.0
    pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=size, keep_ratio=False),
                dict(type='LoadAnnotations', reduce_zero_label=True), dict(type='PackSegInputs')]
    dataset = DATASETS.build(dict(cfg.train_dataloader.dataset, data_root=str(tiny_ade),
                                  pipeline=pipeline))
    batch = pseudo_collate([dataset[0], dataset[1]])
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    reference = copy.deepcopy(model).double()

    def step(net, autocast: bool = False, double: bool = False):
        net.zero_grad()
        with torch.autocast(**FP16, enabled=autocast):
            data = net.data_preprocessor(batch, True)
            if double:
                data['inputs'] = data['inputs'].double()
            losses = net(**data, mode='loss')
        loss, parsed = net.parse_losses(losses)
        loss.backward()
        grads = {n: p.grad.detach().double() for n, p in net.named_parameters()
                 if p.grad is not None}
        return loss.item(), parsed, grads

    loss64, _, grads64 = step(reference, double=True)
    loss32, _, grads32 = step(model)
    loss16, parsed16, grads16 = step(model, autocast=True)
    assert {'decode.loss_ce', 'aux.loss_ce'} <= set(parsed16)  # both heads took part
    assert set(grads16) == set(grads32) == set(grads64)
    assert all(torch.isfinite(g).all() for g in grads16.values())
    assert loss16 == pytest.approx(loss64, rel=1e-3) and loss32 == pytest.approx(loss64, rel=1e-6)
    fp16_over_fp32 = 2.0 ** 13  # their unit roundoffs: 2^-11 and 2^-24
    for part, names in _groups(grads64).items():
        def err(grads):
            return rel_err(torch.cat([grads[n].flatten() for n in names]),
                           torch.cat([grads64[n].flatten() for n in names]))
        assert err(grads16) < 10 * fp16_over_fp32 * err(grads32), (part, err(grads16),
                                                                   err(grads32))
    # the whole update points the same way (measured: cosine 0.98 to 0.99)
    flat16, flat64 = (torch.cat([g[n].flatten() for n in sorted(grads64)]) for g in (grads16,
                                                                                  grads64))
    assert torch.nn.functional.cosine_similarity(flat16, flat64, dim=0) > 0.95
    # a step along the fp16 gradients lowers the loss on the batch
    total = flat16.norm()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in grads16:
                p -= (1e-2 * grads16[name] / total).to(p.dtype)
    assert step(model, autocast=True)[0] < loss16
