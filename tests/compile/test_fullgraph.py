"""Every registered mixer and every backbone family compiles as one graph: ``fullgraph=True``
raises on any graph break. Captured through ``backend='aot_eager'`` (dynamo's graph capture and
AOTAutograd's joint forward/backward graph, no code generation), in training (forward and
backward) and in inference; the compiled result must equal eager's, since aot_eager runs the
same aten ops as eager's reference mode (eager's fast nodes differ by float32 rounding)."""
import itertools

import pytest
import torch
import torch._dynamo as dynamo

from nala_mm.models import NaLaFormer
from nala_mm.models.mixer_specs import build_mixer, mixer_config
from nala_mm.models.swap import (
    DetNaLaSwinTransformer,
    NaLaMixVisionTransformer,
    NaLaPyramidVisionTransformerV2,
    NaLaVisionTransformer,
    SegNaLaSwinTransformer,
)
from nala_mm.ops.attention.config import KERNELS
from nala_mm.ops.attention.feature_maps import QUERY_NORMS
from tests.helpers import TINY_ARCH, grad_errors

MIXERS = {
    **{f'nala-{kernel}-{norm}': dict(type='NormAwareLinearAttention', kernel=kernel,
                                    query_norm=norm)
       for kernel, norm in itertools.product(KERNELS, QUERY_NORMS)},
    # 'elu' is left out: AOTAutograd's decomposition of F.elu's backward fails on its
    # non-contiguous input in torch 2.13 (issue #38, open)
    'linear-relu': dict(type='LinearAttention', feature_map='relu'),
    'softmax': 'softmax',
    'identity': dict(type='IdentityAttention'),
    'window': dict(type='WindowSoftmaxAttention', window_size=4),
    'sdpa': 'sdpa',
}
SWIN = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 4), window_size=4)
MIT = dict(embed_dims=16, num_layers=[1, 1, 1, 1], num_heads=[1, 1, 2, 4])
BACKBONES = {
    'nalaformer-nala': lambda: NaLaFormer(arch=TINY_ARCH, mixers=('nala',) * 4,
                                                 drop_path_rate=0.0),
    'nalaformer-hybrid': lambda: NaLaFormer(arch=TINY_ARCH, drop_path_rate=0.0),
    'mmseg-swin': lambda: SegNaLaSwinTransformer(mixers=('nala',) * 4, **SWIN),
    'mmdet-swin': lambda: DetNaLaSwinTransformer(mixers=('nala', 'nala', 'softmax', 'softmax'),
                                                 **SWIN),
    'mmseg-mit': lambda: NaLaMixVisionTransformer(mixers=('nala',) * 4, **MIT),
    'mmdet-pvtv2': lambda: NaLaPyramidVisionTransformerV2(mixers=('nala',) * 4, **MIT),
    'vit-cls-token': lambda: NaLaVisionTransformer(img_size=64, patch_size=16, embed_dims=32,
                                                   num_layers=2, num_heads=2, mlp_ratio=2,
                                                   mixers=['nala', 'softmax']),
    'vitdet': lambda: NaLaVisionTransformer(
        img_size=64, patch_size=16, embed_dims=32, num_layers=3, num_heads=2, mlp_ratio=2,
        with_cls_token=False, final_norm=False, out_indices=(2,),
        mixers=[dict(type='WindowSoftmaxAttention', window_size=3), 'sdpa', 'nala']),
}


def scalar(out) -> torch.Tensor:
    outs = out if isinstance(out, (tuple, list)) else [out]
    return sum((o.float() * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)


def compiled_matches_eager(module: torch.nn.Module, x: torch.Tensor, train: bool) -> None:
    """Compile ``module`` with fullgraph (a graph break raises) and compare with eager: the
    output and, in training, the input's and every parameter's gradient."""
    dynamo.reset()
    module.train(train)
    compiled = torch.compile(module, backend='aot_eager', fullgraph=True)
    results = []
    for fn in (module, compiled):
        inp = x.clone().requires_grad_(train)
        module.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(train):
            torch.manual_seed(0)  # drop path draws the same
            loss = scalar(fn(inp))
            grads = []
            if train:
                loss.backward()
                grads = [inp.grad] + [p.grad for p in module.parameters() if p.grad is not None]
        results.append((loss.detach(), grads))
    (eager, eager_grads), (comp, comp_grads) = results
    torch.testing.assert_close(comp, eager, rtol=1e-4, atol=1e-4)
    assert len(comp_grads) == len(eager_grads)
    if train:
        errors = grad_errors(comp_grads, eager_grads)
        assert max(errors) < 1e-3, errors


@pytest.mark.parametrize('train', [True, False], ids=['train', 'infer'])
@pytest.mark.parametrize('name', list(MIXERS))
def test_every_mixer_compiles_as_one_graph(name, train):
    torch.manual_seed(0)
    mixer = build_mixer(mixer_config(MIXERS[name]), embed_dims=32, num_heads=2)
    compiled_matches_eager(mixer, torch.randn(2, 7, 9, 32), train)


@pytest.mark.extended  # about 10 s a case here: beyond make test's budget
@pytest.mark.parametrize('train', [True, False], ids=['train', 'infer'])
@pytest.mark.parametrize('name', list(BACKBONES))
def test_every_backbone_family_compiles_as_one_graph(name, train):
    torch.manual_seed(0)
    backbone = BACKBONES[name]()
    backbone.init_weights()
    compiled_matches_eager(backbone, torch.randn(2, 3, 64, 64), train)
