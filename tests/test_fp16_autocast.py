"""fp16 autocast on CPU, the nearest stand-in here for the GPU's fp16 path (mmengine's
``AmpOptimWrapper``, what ``--amp`` runs on a GPU): the token mixers, the backbones and a
segmentation training step run under ``torch.autocast('cpu', dtype=torch.float16)``, stay finite
and stay close to float32.

CPU fp16 kernels round and accumulate differently from a GPU's (on a GPU, matmuls accumulate in
float32 in tensor cores), so this checks the dtype handling, the ranges and the float32 islands
of the code (NaLa's ``k^3`` and per-token power run in float32 under autocast), not the GPU's
exact numbers; the mixer and backbone checks are parametrised over the device, so ``make
test-cuda`` runs them under CUDA's fp16 autocast.

Detection stays out: mmcv's CPU NMS and RoIAlign reject Half tensors ("not implemented for
'Half'"), a limit of mmcv's CPU kernels and not of the GPU path, where both have fp16 kernels.
"""
import copy

import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.registry import init_default_scope

from nala_mm.apis.config_loading import load_config
from nala_mm.models import (
    DEFAULT_HYBRID,
    GatedAttention,
    IdentityAttention,
    LinearAttention,
    NaLaFormer,
    NormAwareLinearAttention,
    SoftmaxAttention,
)
from tests.helpers import DEMO_SEG_CFG, DEVICES, TINY_ARCH, rel_err

FP16 = dict(device_type='cpu', dtype=torch.float16)


def fp16(device: str) -> dict:
    """``torch.autocast``'s arguments for fp16 on ``device``."""
    return dict(FP16, device_type=device)
# fp16 has a 10-bit mantissa (2^-11 = 4.9e-4 per rounding); a layer's output stays within a few
# 1e-3 of float32, a stack of blocks within about 1e-2 (measured: see the asserts' margins)
LAYER_TOL = 5e-3
NETWORK_TOL = 3e-2

MIXERS = {
    'nala-relu': lambda: NormAwareLinearAttention(64, 2, kernel='relu'),
    'nala-cosine': lambda: NormAwareLinearAttention(64, 2, kernel='cosine'),
    'nala-rms': lambda: NormAwareLinearAttention(64, 2, query_norm='rms'),
    'linear': lambda: LinearAttention(64, 2),
    'softmax': lambda: SoftmaxAttention(64, 2),
    'identity': lambda: IdentityAttention(64, 2),
}


def forward_backward(module, x, weights, autocast: bool):
    """Output and input/parameter gradients of ``sum(module(x) * weights)``."""
    module.zero_grad()
    x = x.clone().requires_grad_(True)
    with torch.autocast(**fp16(x.device.type), enabled=autocast):
        out = module(x)
    (out.float() * weights).sum().backward()
    grads = [x.grad] + [p.grad for p in module.parameters() if p.grad is not None]
    return out, grads


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name', MIXERS)
def test_mixers_under_fp16_autocast_are_finite_and_close_to_float32(name, device):
    mixer = MIXERS[name]()
    assert isinstance(mixer, GatedAttention)
    mixer.to(device)
    x = torch.randn(2, 12, 10, 64).to(device)  # channels-last tokens of a 12 x 10 grid
    weights = torch.randn(2, 12, 10, 64).to(device)
    out32, grads32 = forward_backward(mixer, x, weights, autocast=False)
    out16, grads16 = forward_backward(mixer, x, weights, autocast=True)
    # really computed in fp16 (the output leaves in the autocast dtype) ...
    assert out16.dtype == torch.float16 and out32.dtype == torch.float32
    assert torch.isfinite(out16).all() and all(torch.isfinite(g).all() for g in grads16)
    # ... and close to float32, forward and backward
    assert rel_err(out16.float(), out32) < LAYER_TOL
    assert len(grads16) == len(grads32)
    assert max(rel_err(a.float(), b) for a, b in zip(grads16, grads32)) < 2 * LAYER_TOL


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


BACKBONES = {
    'nalaformer-hybrid': lambda: NaLaFormer(arch=TINY_ARCH),
    'nalaformer-all-linear': lambda: NaLaFormer(arch=TINY_ARCH, mixers=('nala',) * 4),
}


def _swapped():
    from nala_mm.models.swap import (
        NaLaMixVisionTransformer,
        NaLaPyramidVisionTransformerV2,
        NaLaVisionTransformer,
        SegNaLaSwinTransformer,
    )
    hybrid = DEFAULT_HYBRID
    return {
        'swin': lambda: SegNaLaSwinTransformer(mixers=hybrid, embed_dims=32, depths=(2, 2, 2, 2),
                                               num_heads=(1, 2, 4, 8), window_size=7),
        'mit': lambda: NaLaMixVisionTransformer(mixers=hybrid, embed_dims=32,
                                                num_layers=[2, 2, 2, 2], num_heads=[1, 2, 5, 8]),
        'pvtv2': lambda: NaLaPyramidVisionTransformerV2(mixers=hybrid, embed_dims=32,
                                                        num_layers=[2, 2, 2, 2]),
        'vit': lambda: NaLaVisionTransformer(
            mixers=('nala', 'nala', 'softmax'), img_size=(64, 64), patch_size=16, embed_dims=64,
            num_layers=3, num_heads=2, mlp_ratio=2, out_indices=(0, 2),
            norm_cfg=dict(type='LN', eps=1e-6)),
    }


BACKBONES.update(_swapped())


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name', BACKBONES)
def test_backbones_under_fp16_autocast_are_finite_and_close_to_float32(name, device):
    model = BACKBONES[name]().to(device)
    model.eval()  # (mmseg's Swin and ViT return None from train())
    image = torch.randn(1, 3, 96, 128).to(device)
    with torch.no_grad():
        expected = model(image)
        dtypes = []
        hooks = [m.register_forward_hook(lambda _, __, out: dtypes.append(out.dtype))
                 for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
        with torch.autocast(**fp16(device)):
            actual = model(image)
        for hook in hooks:
            hook.remove()
    assert len(actual) == len(expected) >= 2
    for stage, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, stage
        assert torch.isfinite(a).all(), f'stage {stage} is not finite under fp16'
        assert rel_err(a.float(), e) < NETWORK_TOL, (stage, rel_err(a.float(), e))
    # the network really ran in fp16 (the output norms may hand back float32)
    assert dtypes and set(dtypes) == {torch.float16}, set(dtypes)


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
