"""Inductor's generated code (C++/OpenMP here, Triton on CUDA) against eager: one NaLa mixer, a
tiny NaLaFormer and a tiny NaLa ViT, each at two sizes, forward and gradients within float32
tolerance. Compiled, the ops run their reference formulas (nala_mm.ops.mode); eager runs the
hand-written fast nodes: the two paths are independent.

In make test-extended: inductor's C++ compilation of the three models takes about 160 s on the
2-core CPU, more than make test's budget allows."""
import pytest
import torch
import torch._dynamo as dynamo

from nala_mm.models import NaLaFormer
from nala_mm.models.mixer_specs import build_mixer, mixer_config
from nala_mm.models.swap import NaLaVisionTransformer
from tests.helpers import DEVICES, TINY_ARCH, grad_errors, rel_err

pytestmark = pytest.mark.extended

MODELS = {
    # the mixer on channels-last tokens (B, H, W, C); the backbones on images
    'nala-mixer': (lambda: build_mixer(mixer_config('nala'), embed_dims=32, num_heads=2),
                   [(2, 7, 9, 32), (2, 12, 10, 32)]),
    'nalaformer': (lambda: NaLaFormer(arch=TINY_ARCH, mixers=('nala',) * 4),
                   [(2, 3, 64, 64), (1, 3, 96, 80)]),
    'vit': (lambda: NaLaVisionTransformer(img_size=64, patch_size=16, embed_dims=32,
                                          num_layers=2, num_heads=2, mlp_ratio=2,
                                          mixers=['nala', 'nala']),
            [(2, 3, 64, 64), (1, 3, 96, 80)]),
}


def loss_and_grads(fn, module, x):
    inp = x.clone().requires_grad_(True)
    module.zero_grad(set_to_none=True)
    out = fn(inp)
    outs = out if isinstance(out, (tuple, list)) else [out]
    loss = sum((o.float() * torch.linspace(-1, 1, o.numel(), device=o.device).view_as(o)).sum()
               for o in outs)
    loss.backward()
    return [o.detach() for o in outs], [inp.grad] + [p.grad for p in module.parameters()]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name', list(MODELS))
def test_inductor_matches_eager_at_two_sizes(name, device):
    build, shapes = MODELS[name]
    torch.manual_seed(0)
    module = build().to(device)
    module.init_weights()
    module.eval()  # no drop path: the two runs must see the same network
    dynamo.reset()
    # static sizes, as nala_mm.apis.compile compiles them (one graph per size)
    compiled = torch.compile(module, fullgraph=True, dynamic=False)  # backend='inductor'
    for shape in shapes:
        x = torch.randn(*shape, device=device)
        eager_out, eager_grads = loss_and_grads(module, module, x)
        comp_out, comp_grads = loss_and_grads(compiled, module, x)
        for got, want in zip(comp_out, eager_out):
            assert got.shape == want.shape
            assert rel_err(got, want) < 1e-4, (shape, rel_err(got, want))
        assert all(g is not None for g in comp_grads)  # every parameter is reached
        assert max(grad_errors(comp_grads, eager_grads)) < 1e-3, shape


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device')
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('name', ['nala-mixer', 'nalaformer'])
def test_inductor_under_autocast_matches_eager_on_cuda(name, dtype):
    """Triton code under fp16 / bf16 autocast against eager under the same autocast: NaLa's
    feature maps and state stay float32 in both, so they agree to the 16-bit rounding."""
    build, shapes = MODELS[name]
    torch.manual_seed(0)
    module = build().cuda().eval()
    module.init_weights()
    dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, dynamic=False)
    x = torch.randn(*shapes[0], device='cuda')
    with torch.autocast('cuda', dtype=dtype):
        eager_out, eager_grads = loss_and_grads(module, module, x)
        comp_out, comp_grads = loss_and_grads(compiled, module, x)
    for got, want in zip(comp_out, eager_out):
        assert torch.isfinite(got).all() and rel_err(got.float(), want.float()) < 2e-2
    assert max(grad_errors(comp_grads, eager_grads)) < 5e-2
