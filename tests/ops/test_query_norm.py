"""NaLa's ``query_norm='rms'`` switch: the exponent reads ``tanh(||q|| / sqrt(d))``.

Held to the formula written out independently (tests/reference/formulas.py, the root mean square
of the components) in float64, both modes, forward and gradients, at query norms where the
paper's exponent has saturated; and the exponent's values themselves."""
import math

import pytest
import torch

from nala_mm.models import NormAwareLinearAttention
from nala_mm.ops import NaLaConfig, nala_attention
from tests.helpers import value_and_grads
from tests.reference import formulas

TOL = 1e-6
HEIGHT, WIDTH, DIMS = 5, 7, 8  # N = 35: odd, not a multiple of the chunk
CHUNK = 8


def _inputs(query_norm: float, seed: int):
    gen = torch.Generator().manual_seed(seed)
    shape = (2, 2, HEIGHT * WIDTH, DIMS)
    q = torch.randn(shape, generator=gen, dtype=torch.float64)
    # norms spread around query_norm: the exponent differs from token to token
    q = q / q.norm(dim=-1, keepdim=True) * query_norm * torch.rand(
        shape[:-1] + (1,), generator=gen, dtype=torch.float64).add(0.5)
    k = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.7
    v = torch.randn(shape, generator=gen, dtype=torch.float64)
    weights = torch.randn(shape, generator=gen, dtype=torch.float64)
    return q, k, v, weights




@pytest.mark.parametrize('mode', ['fast', 'reference'])
@pytest.mark.parametrize('use_rope', [False, True], ids=['no-rope', 'rope'])
@pytest.mark.parametrize('query_norm', [1.0, 6.0])
@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
def test_rms_exponent_meets_its_formula(mode, use_rope, query_norm, kernel):
    q, k, v, weights = _inputs(query_norm, seed=len(kernel) + int(query_norm))
    rope = formulas.rope_tables(HEIGHT, WIDTH, DIMS) if use_rope else None
    cfg = NaLaConfig(kernel=kernel, query_norm='rms')
    got = value_and_grads(lambda a, b, c: nala_attention(a, b, c, cfg, rope, mode, chunk=CHUNK),
                          q, k, v, weights)
    want = value_and_grads(lambda a, b, c: formulas.nala(a, b, c, kernel, rope=rope, rms=True),
                           q, k, v, weights)
    for g, w in zip(got, want):
        scale = w.abs().max().clamp_min(1e-12)
        assert (g - w).abs().max() / scale < TOL
    # and it is another function than the paper's exponent at these norms
    raw = nala_attention(q, k, v, NaLaConfig(kernel=kernel), rope, mode, chunk=CHUNK)
    assert (raw - got[0]).abs().max() / got[0].abs().max() > 1e-3


def test_rms_exponent_stays_below_the_ceiling_where_the_paper_saturates():
    query_map = NaLaConfig(query_norm='rms').feature_maps()[0]
    paper = NaLaConfig().feature_maps()[0]
    rho = torch.tensor([[0.5], [3.0], [8.0]], dtype=torch.float64)
    # lam (tau + tanh(rho / sqrt(32))), lam = 3, tau = 0.5; the paper's reads tanh(rho)
    expected = [3 * (0.5 + math.tanh(r / math.sqrt(32))) for r in (0.5, 3.0, 8.0)]
    assert query_map.power(rho, 32).flatten().tolist() == pytest.approx(expected, rel=1e-12)
    assert query_map.power(rho, 32)[1].item() == pytest.approx(2.9569, abs=1e-4)
    assert paper.power(rho, 32)[1].item() == pytest.approx(4.4851, abs=1e-4)  # 99.7 % of 4.5


def test_layer_switch_and_bad_value():
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(32, 2, query_norm='rms')
    paper = NormAwareLinearAttention(32, 2)
    paper.load_state_dict(layer.state_dict())  # the same parameters: any checkpoint loads
    x = torch.randn(1, 6, 6, 32)
    assert not torch.allclose(layer(x), paper(x))
    assert 'sqrt(d)' in repr(layer.query_map)
    with pytest.raises(ValueError, match="query_norm=.*'l2'"):
        NormAwareLinearAttention(32, 2, query_norm='l2')
