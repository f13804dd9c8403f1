"""``mode='fast' | 'reference'`` on a backbone reaches every op with two paths, and the two
paths give the same outputs and parameter gradients, for NaLaFormer and each swapped family."""
from typing import Callable, Dict

import pytest
import torch
from mmdet.models.backbones import PyramidVisionTransformerV2  # noqa: F401  (registers mmdet)

from nala_mm.models import NaLaFormer
from nala_mm.models.swap import (
    DetNaLaSwinTransformer,
    NaLaMixVisionTransformer,
    NaLaPyramidVisionTransformerV2,
    NaLaVisionTransformer,
    SegNaLaSwinTransformer,
)
from tests.helpers import DEVICES

TINY = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4))
SWIN = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), window_size=7,
            mixers=('nala', 'linear', 'softmax', 'nala'))
SR = dict(embed_dims=16, num_layers=[1, 1, 1, 1], num_heads=[1, 2, 4, 4],
          mixers=('nala', 'linear', 'softmax', 'nala'))
BACKBONES: Dict[str, Callable[[str], torch.nn.Module]] = {
    'nalaformer': lambda mode: NaLaFormer(arch=TINY, mixers=('nala', 'linear', 'softmax', 'nala'),
                                          mode=mode),
    'mmseg-swin': lambda mode: SegNaLaSwinTransformer(mode=mode, **SWIN),
    'mmdet-swin': lambda mode: DetNaLaSwinTransformer(mode=mode, **SWIN),
    'mmseg-mit': lambda mode: NaLaMixVisionTransformer(mode=mode, **SR),
    'mmdet-pvtv2': lambda mode: NaLaPyramidVisionTransformerV2(mode=mode, **SR),
    'mmseg-vit': lambda mode: NaLaVisionTransformer(
        img_size=(48, 48), patch_size=16, embed_dims=32, num_layers=2, num_heads=2,
        out_indices=(1,), with_cls_token=True, final_norm=True,
        mixers=('nala', 'linear'), mode=mode),
}


def modes_of(model: torch.nn.Module) -> set:
    """The ``mode`` of every module that has one (the backbone, its mixers, FFNs, convs)."""
    return {m.mode for m in model.modules() if isinstance(getattr(m, 'mode', None), str)}


def forward_backward(model: torch.nn.Module, x: torch.Tensor):
    model.train()
    torch.manual_seed(1)  # the same DropPath masks in both modes
    outputs = [o for o in model(x)]
    sum((o.double() * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o)).sum()
        for o in outputs).backward()
    return outputs, {n: p.grad.clone() for n, p in model.named_parameters()
                     if p.grad is not None}


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name', BACKBONES)
def test_reference_and_fast_modes_agree_on_every_backbone(name, device):
    torch.manual_seed(0)
    fast = BACKBONES[name]('fast').to(device)
    reference = BACKBONES[name]('reference').to(device)
    reference.load_state_dict(fast.state_dict(), strict=True)
    assert modes_of(fast) == {'fast'} and modes_of(reference) == {'reference'}
    # the number of modules the switch reaches: the backbone's own ops, not only the mixers
    assert sum(isinstance(getattr(m, 'mode', None), str) for m in fast.modules()) > 2 * len(
        [m for m in fast.modules() if hasattr(m, 'mix')])
    x = torch.randn(2, 3, 45, 51).to(device)  # odd: the fast and reference paths pad alike
    out_fast, grad_fast = forward_backward(fast, x)
    out_ref, grad_ref = forward_backward(reference, x)
    assert len(out_fast) == len(out_ref)
    for a, b in zip(out_fast, out_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert grad_fast.keys() == grad_ref.keys() and len(grad_fast) > 10
    # float32 rounding, against the largest gradient (a conv bias before a BatchNorm has a true
    # gradient of zero: there the two paths differ by rounding alone)
    scale = max(g.abs().max() for g in grad_ref.values())
    worst = {key: float((grad_fast[key] - grad_ref[key]).abs().max() / scale) for key in grad_fast}
    assert max(worst.values()) < 1e-4, sorted(worst.items(), key=lambda kv: -kv[1])[:3]


def test_a_mixer_config_that_names_another_mode_is_refused():
    with pytest.raises(ValueError, match=r"mode='reference' inside a backbone built with "
                                         r"mode='fast'"):
        NaLaFormer(arch=TINY, mixers=(dict(type='NormAwareLinearAttention', mode='reference'),
                                      'nala', 'softmax', 'softmax'))
    with pytest.raises(ValueError, match="unknown mode 'quick'"):
        NaLaFormer(arch=TINY, mode='quick')
    with pytest.raises(ValueError, match="unknown mode 'quick'"):
        SegNaLaSwinTransformer(mode='quick', **SWIN)
