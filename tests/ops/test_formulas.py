"""The package's attention ops against the formulas written out independently
(tests/reference/formulas.py), in float64, both modes, forward and gradients."""
import ast
import pathlib

import pytest
import torch

from nala_mm.ops import (
    NaLaConfig,
    build_plain_feature_map,
    kernelized_attention,
    nala_attention,
    rope_table,
)
from tests.helpers import DEVICES, value_and_grads
from tests.reference import formulas

TOL = 1e-6
HEIGHT, WIDTH = 5, 7  # N = 35: odd, and not a multiple of the fast mode's chunk below
CHUNK = 8


def _inputs(query_norm: float, seed: int, heads: int = 2, dims: int = 8):
    gen = torch.Generator().manual_seed(seed)
    shape = (2, heads, HEIGHT * WIDTH, dims)
    q = torch.randn(shape, generator=gen, dtype=torch.float64)
    # every query at the chosen norm: 0.3 is where tanh(rho) still responds, 3 where it saturates
    q = q / q.norm(dim=-1, keepdim=True) * query_norm
    k = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.7
    v = torch.randn(shape, generator=gen, dtype=torch.float64)
    weights = torch.randn(shape, generator=gen, dtype=torch.float64)
    return q, k, v, weights




def on(device, *tensors):
    return tuple(t.to(device) for t in tensors)


def _assert_close(got, want):
    got = got.cpu()
    scale = want.abs().max().clamp_min(1e-12)
    assert (got - want).abs().max() / scale < TOL, float((got - want).abs().max() / scale)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('mode', ['fast', 'reference'])
@pytest.mark.parametrize('use_rope', [False, True], ids=['no-rope', 'rope'])
@pytest.mark.parametrize('query_norm', [0.3, 3.0])
@pytest.mark.parametrize('kernel, alpha', [('cosine', 1.0), ('cosine', 5.0), ('cosine', 20.0),
                                           ('relu', 20.0), ('positive', 20.0)])
def test_nala_meets_its_formula(mode, use_rope, query_norm, kernel, alpha, device):
    q, k, v, weights = _inputs(query_norm, seed=int(alpha) + len(kernel))
    rope = formulas.rope_tables(HEIGHT, WIDTH, q.shape[-1]) if use_rope else None
    cfg = NaLaConfig(kernel=kernel, alpha=alpha)
    table = on(device, *rope) if use_rope else None
    got = value_and_grads(lambda a, b, c: nala_attention(a, b, c, cfg, table, mode, chunk=CHUNK),
                          *on(device, q, k, v, weights))
    want = value_and_grads(lambda a, b, c: formulas.nala(a, b, c, kernel, alpha, rope=rope),
                           q, k, v, weights)
    for g, w in zip(got, want):
        _assert_close(g, w)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('mode', ['fast', 'reference'])
def test_nala_without_norm_awareness_meets_its_formula(mode, device):
    q, k, v, weights = _inputs(1.0, seed=3)
    rope = formulas.rope_tables(HEIGHT, WIDTH, q.shape[-1])
    cfg = NaLaConfig(kernel='cosine', norm_aware=False, fixed_power=2.5)
    table = on(device, *rope)
    got = value_and_grads(lambda a, b, c: nala_attention(a, b, c, cfg, table, mode, chunk=CHUNK),
                          *on(device, q, k, v, weights))
    want = value_and_grads(
        lambda a, b, c: formulas.nala(a, b, c, 'cosine', rope=rope, fixed_power=2.5),
        q, k, v, weights)
    for g, w in zip(got, want):
        _assert_close(g, w)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('mode', ['fast', 'reference'])
@pytest.mark.parametrize('use_rope', [False, True], ids=['no-rope', 'rope'])
@pytest.mark.parametrize('feature_map', ['relu', 'elu'])
def test_linear_attention_meets_its_formula(mode, use_rope, feature_map, device):
    q, k, v, weights = _inputs(1.5, seed=7)
    rope = formulas.rope_tables(HEIGHT, WIDTH, q.shape[-1]) if use_rope else None
    phi = build_plain_feature_map(feature_map)
    table = on(device, *rope) if use_rope else None
    got = value_and_grads(
        lambda a, b, c: kernelized_attention(a, b, c, phi, phi, 1e-6, table, mode, CHUNK),
        *on(device, q, k, v, weights))
    want = value_and_grads(lambda a, b, c: formulas.linear(a, b, c, feature_map, rope=rope),
                           q, k, v, weights)
    for g, w in zip(got, want):
        _assert_close(g, w)


@pytest.mark.parametrize('head_dim', [4, 8, 32])
def test_rope_table_meets_the_released_frequencies(head_dim):
    cos, sin = rope_table(6, 9, head_dim)
    want_cos, want_sin = formulas.rope_tables(6, 9, head_dim)
    # the package builds float32 tables: float32 rounding of angles up to ~8 rad
    assert torch.allclose(cos.double(), want_cos, atol=2e-6, rtol=0)
    assert torch.allclose(sin.double(), want_sin, atol=2e-6, rtol=0)


def test_the_references_import_nothing_from_the_package():
    """The references import each other and torch, nothing of the package; the released op
    sequence imports only torch (the benchmarks time it against the fast path too). The import
    rules between folders are ruff's (TID251); this allow-list is the one ruff cannot state."""
    reference = pathlib.Path(__file__).resolve().parents[1] / 'reference'
    imported = {}
    for path in reference.glob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported[path.name] = imported.get(path.name, []) + [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                imported[path.name] = imported.get(path.name, []) + [node.module or '.']
    assert 'formulas.py' in imported
    offenders = {name: mods for name, mods in imported.items()
                 if any(m.split('.')[0] in ('nala_mm', '.') or
                        m.startswith('tests') and m != 'tests.reference.released_op'
                        for m in mods)}
    assert offenders == {}
    assert {m.split('.')[0] for m in imported['released_op.py']} <= {'typing', 'torch'}
