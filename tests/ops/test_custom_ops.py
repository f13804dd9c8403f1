"""The fast nodes as torch custom ops: ``torch.library.opcheck`` on every op and backward op, the
attention split at its state (sums that add over token blocks, checked against the written
formulas), one compiled graph over changing token counts, and the ops as nodes of a model's
captured graph."""
import pytest
import torch
import torch._dynamo as dynamo
import torch.nn.functional as F
from torch._dynamo.utils import counters

from nala_mm.models import NaLaFormer
from nala_mm.ops import (
    NaLaConfig,
    build_plain_feature_map,
    conv2d,
    gelu_conv,
    kernelized_attention,
    kernelized_readout,
    kernelized_state,
)
from nala_mm.ops.attention.feature_maps import (
    FeatureMap,
    feature_map_from_spec,
    feature_map_spec,
)
from tests.helpers import DEVICES, TINY_ARCH, SquaredReLU, rel_err
from tests.reference import formulas


class Shifted(FeatureMap):
    """A user's map with a constructor argument, which it returns from ``numbers``."""

    def __init__(self, shift: float):
        self.shift = shift

    def numbers(self):
        return (self.shift,)

    def forward(self, x):
        return F.relu(x + self.shift)

    def backward(self, x, d_features):
        return d_features * (x + self.shift > 0)


MAPS = {
    **{f'nala-{kernel}': NaLaConfig(kernel=kernel).feature_maps()
       for kernel in ('cosine', 'relu', 'positive')},
    'nala-rms-fixed': NaLaConfig(query_norm='rms', norm_aware=False,
                                 fixed_power=2.5).feature_maps(),
    'relu': (build_plain_feature_map('relu'),) * 2,
    'elu': (build_plain_feature_map('elu'),) * 2,
    'user': (SquaredReLU(),) * 2,
}
# each map's features as the written formulas compute them
WRITTEN = {
    **{f'nala-{kernel}': (lambda q, kernel=kernel: formulas.nala_query_features(q, kernel),
                          lambda k, kernel=kernel: formulas.nala_key_features(k, kernel))
       for kernel in ('cosine', 'relu', 'positive')},
    'nala-rms-fixed': (lambda q: formulas.nala_query_features(q, 'cosine', fixed_power=2.5,
                                                              rms=True),
                       lambda k: formulas.nala_key_features(k, 'cosine')),
    'relu': (lambda x: formulas.linear_features(x, 'relu'),) * 2,
    'elu': (lambda x: formulas.linear_features(x, 'elu'),) * 2,
    'user': (lambda x: x.clamp_min(0) ** 2,) * 2,
}
N_TOKENS, HEAD_DIM, CHUNK = 35, 8, 16  # three chunks, the last ragged


def inputs(device, rope: bool, seed=0, n_tokens=N_TOKENS, grad=True):
    gen = torch.Generator().manual_seed(seed)
    # q, k, v as the mixers pass them: heads split off channels-last tokens (a strided view)
    q, k, v = (torch.randn(2, n_tokens, 3, HEAD_DIM, generator=gen).transpose(1, 2)
               .to(device).requires_grad_(grad) for _ in range(3))
    cos, sin = formulas.rope_tables(5, 7, HEAD_DIM) if rope else (None, None)
    if rope:
        cos, sin = (t.float().to(device) for t in (cos, sin))
    return q, k, v, cos, sin


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('rope', [True, False], ids=['rope', 'no-rope'])
# a split kernel with and without the direction, a plain map, a user's (the other maps differ
# from these only in numbers and formulas, which the parity tests hold)
@pytest.mark.parametrize('name', ['nala-cosine', 'nala-relu', 'relu', 'user'])
def test_attention_ops_pass_opcheck(name, rope, device):
    query_map, key_map = MAPS[name]
    q, k, v, cos, sin = inputs(device, rope)
    key_spec, query_spec = feature_map_spec(key_map), feature_map_spec(query_map)
    torch.library.opcheck(kernelized_state, (k, v, cos, sin, *key_spec, CHUNK))
    state, key_sum = (t.detach() / N_TOKENS for t in
                      kernelized_state(k, v, cos, sin, *key_spec, CHUNK))
    readout_args = (q, state.requires_grad_(), key_sum.requires_grad_(), cos, sin, *query_spec,
                    1e-6, CHUNK)
    torch.library.opcheck(kernelized_readout, readout_args)
    out, normaliser = (t.detach() for t in kernelized_readout(*readout_args))
    plain = [t.detach() for t in (q, k, v, state, key_sum)]
    q, k, v, state, key_sum = plain
    torch.library.opcheck(torch.ops.nala_mm.kernelized_state_backward,
                          (torch.randn_like(state), torch.randn_like(key_sum), k, v, cos, sin,
                           *key_spec, CHUNK))
    for d_normaliser in (None, torch.randn_like(normaliser)):
        torch.library.opcheck(torch.ops.nala_mm.kernelized_readout_backward,
                              (torch.randn_like(out), d_normaliser, q, state, key_sum,
                               normaliser, cos, sin, *query_spec, CHUNK))


@pytest.mark.parametrize('device', DEVICES)
def test_block_ops_pass_opcheck(device):
    """gelu_conv (the FFN's 3x3 depthwise) and conv2d (LePE's depthwise 5x5, the 3x3/s2
    downsample) on channels-last maps of odd sizes, with and without a bias."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape, grad=True):
        return torch.randn(*shape, generator=gen).to(device).requires_grad_(grad)

    x = randn(2, 12, 9, 11, grad=False).to(memory_format=torch.channels_last).requires_grad_()
    for with_bias in (True, False):
        bias = randn(12) if with_bias else None
        torch.library.opcheck(torch.ops.nala_mm.gelu_conv, (x, randn(12, 1, 3, 3), bias,
                                                            [1, 1], 12))
        torch.library.opcheck(torch.ops.nala_mm.conv2d, (x, randn(12, 1, 5, 5), bias, [1, 1],
                                                         [2, 2], 12))
        torch.library.opcheck(torch.ops.nala_mm.conv2d, (x, randn(16, 12, 3, 3),
                                                         randn(16) if with_bias else None,
                                                         [2, 2], [1, 1], 1))
    plain = x.detach()
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        torch.library.opcheck(torch.ops.nala_mm.gelu_conv_backward,
                              (randn(2, 12, 9, 11, grad=False), plain,
                               randn(12, 1, 3, 3, grad=False), [1, 1], 12, mask))
        torch.library.opcheck(torch.ops.nala_mm.conv2d_backward,
                              (randn(2, 16, 5, 6, grad=False), plain,
                               randn(16, 12, 3, 3, grad=False), [2, 2], [1, 1], 1, mask))


@pytest.mark.parametrize('name', list(MAPS))
def test_state_sums_add_over_token_blocks_and_the_readout_matches_the_formula(name):
    """The split the token-parallel path relies on: the state op's two sums over two blocks of
    tokens add up to the sums over all of them, and the readout of their means is the attention
    over every token (the written formula in float64)."""
    query_map, key_map = MAPS[name]
    q, k, v, cos, sin = (t if t is None else t.detach() for t in inputs('cpu', rope=True))
    key_spec = feature_map_spec(key_map)
    whole = kernelized_state(k, v, cos, sin, *key_spec, CHUNK)
    split = 20  # not a chunk boundary
    parts = [kernelized_state(k[..., rows, :], v[..., rows, :], cos[rows], sin[rows], *key_spec,
                              CHUNK) for rows in (slice(0, split), slice(split, None))]
    for got, want in zip(map(sum, zip(*parts)), whole):
        assert rel_err(got, want) < 1e-6
    out, _ = kernelized_readout(q, whole[0] / N_TOKENS, whole[1] / N_TOKENS, cos, sin,
                                *feature_map_spec(query_map), 1e-6, CHUNK)
    query_features, key_features = WRITTEN[name]
    written = formulas.kernelized(query_features(q.double()), key_features(k.double()),
                                  v.double(), 1e-6, formulas.rope_tables(5, 7, HEAD_DIM))
    assert rel_err(out.double(), written) < 1e-5


def test_feature_maps_travel_as_name_and_numbers():
    for name, maps in MAPS.items():
        for fmap in maps:
            spec = feature_map_spec(fmap)
            rebuilt = feature_map_from_spec(*spec)
            assert type(rebuilt) is type(fmap) and feature_map_spec(rebuilt) == spec, name
            assert all(type(n) is float for n in spec[1]), spec
    x = torch.randn(4, 8)
    assert torch.equal(feature_map_from_spec(*feature_map_spec(Shifted(0.25))).forward(x),
                       Shifted(0.25).forward(x))


def test_a_map_that_cannot_travel_is_refused_with_its_name():
    class Scaled(FeatureMap):  # takes an argument, does not say which

        def __init__(self, scale):
            self.scale = scale

    with pytest.raises(TypeError, match='Scaled takes constructor arguments but does not '
                                        'define numbers'):
        feature_map_spec(Scaled(2.0))
    with pytest.raises(KeyError, match="no FeatureMap registered as 'my.Missing'"):
        feature_map_from_spec('my.Missing', [])


def graphs_compiled(fn, calls) -> int:
    """Graphs dynamo compiles for ``fn`` over ``calls`` (each a tuple of arguments), training:
    forward and backward with ``dynamic=True`` through AOTAutograd."""
    dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, backend='aot_eager', dynamic=True, fullgraph=True)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for args in calls:
            out = compiled(*args)
            want = fn(*args)
            assert rel_err(out.detach(), want.detach()) < 1e-6
            out.sum().backward()
    return counters['stats']['unique_graphs']


def test_each_op_compiles_once_for_every_token_count():
    query_map, key_map = MAPS['nala-cosine']

    def attention(q, k, v, cos, sin):
        return kernelized_attention(q, k, v, query_map, key_map, rope=(cos, sin))

    calls = []
    for height, width in ((5, 7), (6, 9), (11, 4)):
        q, k, v = (torch.randn(2, 3, height * width, HEAD_DIM, requires_grad=True)
                   for _ in range(3))
        calls.append((q, k, v, *(t.float() for t in formulas.rope_tables(height, width,
                                                                         HEAD_DIM))))
    assert graphs_compiled(attention, calls) == 1

    def block_ops(x, dw3, dw5, dense):
        hidden = gelu_conv(x, dw3, None, (1, 1), 12)
        return conv2d(conv2d(hidden, dw5, None, (1, 1), (2, 2), 12), dense, None, (2, 2),
                      (1, 1))

    weights = [torch.randn(12, 1, 3, 3, requires_grad=True),
               torch.randn(12, 1, 5, 5, requires_grad=True),
               torch.randn(8, 12, 3, 3, requires_grad=True)]
    calls = [(torch.randn(2, 12, h, w).to(memory_format=torch.channels_last)
              .requires_grad_(), *weights) for h, w in ((9, 11), (12, 7), (16, 16))]
    assert graphs_compiled(block_ops, calls) == 1


def test_a_captured_model_holds_the_ops_as_nodes():
    """The graph dynamo hands the backend (what inductor compiles) for a tiny all-NaLa
    NaLaFormer in training: every block's state and readout ops, its FFN's gelu_conv, the
    conv2d of its LePE and two CPEs, of each downsample and of the stem's four convs; no
    reference formula in their place and no ATen convolution left (inductor's own lowering of
    a convolution's backward specialises on the input size)."""
    torch.manual_seed(0)
    model = NaLaFormer(arch=TINY_ARCH, mixers=('nala',) * 4, drop_path_rate=0.0)
    graphs = []

    def record(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    dynamo.reset()
    outs = torch.compile(model, backend=record, fullgraph=True)(torch.randn(1, 3, 64, 48))
    sum(o.sum() for o in outs).backward()
    targets = [str(node.target) for node in graphs[0].graph.nodes
               if node.op == 'call_function']
    blocks, downsamples, stem = sum(TINY_ARCH['depths']), 3, 4
    counts = {op: sum(t == f'nala_mm.{op}.default' for t in targets)
              for op in ('kernelized_state', 'kernelized_readout', 'gelu_conv', 'conv2d')}
    assert counts == dict(kernelized_state=blocks, kernelized_readout=blocks, gelu_conv=blocks,
                          conv2d=3 * blocks + downsamples + stem)
    assert not [t for t in targets if 'complex' in t or 'conv' in t and 'nala_mm' not in t]
