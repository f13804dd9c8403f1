"""A new kernelised mixer is one file: a feature map and a :class:`KernelizedMixer` subclass,
registered here under a unique name (and removed from the registry afterwards), runs through
NaLaFormer, a swapped Swin, the FLOP counter and the attention statistics without any table
outside its own definition being edited."""
import uuid

import pytest
import torch
import torch.nn.functional as F
from mmengine.registry import MODELS

from nala_mm.analysis import analyze_backbone, count_flops
from nala_mm.models import KernelizedMixer, NaLaFormer
from nala_mm.models.swap import SegNaLaSwinTransformer
from nala_mm.registry import register_model
from tests.helpers import TINY_ARCH, SquaredReLU, rel_err
from tests.reference import formulas


class ToySquaredReLUAttention(KernelizedMixer):

    def __init__(self, embed_dims: int, num_heads: int, eps: float = 1e-6, **kwargs):
        super().__init__(embed_dims, num_heads, SquaredReLU(), SquaredReLU(), eps, **kwargs)


@pytest.fixture
def toy_type():
    name = f'ToySquaredReLUAttention_{uuid.uuid4().hex[:8]}'
    register_model(type(name, (ToySquaredReLUAttention,), {}))
    yield name
    del MODELS.module_dict[name]


def test_its_fast_path_matches_the_formula_forward_and_backward(toy_type):
    layer = MODELS.build(dict(type=toy_type, embed_dims=16, num_heads=2))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 35, 8, generator=gen).requires_grad_() for _ in range(3))
    rope = formulas.rope_tables(5, 7, 8)
    fast = layer.mix(q, k, v, tuple(t.float() for t in rope))
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    written = formulas.kernelized(F.relu(exact[0]) ** 2, F.relu(exact[1]) ** 2, exact[2], 1e-6,
                                  rope)
    assert rel_err(fast.double(), written) < 1e-5
    weights = torch.randn(written.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((fast * weights.float()).sum(), (q, k, v))
    expected = torch.autograd.grad((written * weights).sum(), exact)
    for got, want in zip(grads, expected):
        assert rel_err(got.double(), want) < 1e-4


def test_it_runs_in_nalaformer_a_swapped_swin_the_flop_counter_and_the_statistics(toy_type):
    mixer = dict(type=toy_type)
    backbone = NaLaFormer(arch=TINY_ARCH, mixers=(mixer, 'nala', 'softmax', 'softmax')).eval()
    image = torch.randn(1, 3, 64, 64)
    assert type(backbone.layers[0].blocks[0].attn).__name__ == toy_type

    swin = SegNaLaSwinTransformer(mixers=(mixer, 'softmax', 'softmax', 'softmax'),
                                  embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                                  window_size=7)
    swin.eval()  # (mmseg's Swin.train returns None)
    with torch.no_grad():
        assert [tuple(o.shape[1:]) for o in swin(image)] == [
            (32, 16, 16), (64, 8, 8), (128, 4, 4), (256, 2, 2)]
    assert swin.stage_of('stages.0.blocks.1.attn.mixer') == 0

    # stage 1: 16 x 16 tokens, one head of 16 channels, feature width e*d = 16 (e = 1): the
    # state and the numerator N*e*d*d each, the normaliser N*e*d
    flops = count_flops(backbone, (image,))
    toy_matmul = 256 * (2 * 16 * 16 + 16)
    # stage 2, NaLa (e = 2): 8 x 8 tokens, two heads of 16, 4*N*d^2 + 2*N*d per head
    nala_matmul = 2 * (4 * 64 * 16 ** 2 + 2 * 64 * 16)
    assert flops.by_operator['attn_matmul'] == toy_matmul + nala_matmul

    stats = analyze_backbone(backbone, image)
    toy = stats['layers.0.blocks.0.attn']
    assert (toy.mixer, toy.stage, toy.grid) == (toy_type, 0, (16, 16))
    assert toy.entropy_rows == 'without RoPE'  # a kernelised mixer's rows with RoPE are signed
    assert toy.norm_aware is None and toy.saturated_share is None  # it has no query exponent
    assert 0 < toy.entropy.min() and toy.entropy.max() <= torch.log(torch.tensor(256.)) + 1e-6
