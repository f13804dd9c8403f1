"""FLOP counting: the NaLa and SDPA handles against analytic counts, and tools/get_flops.py."""
import math
import os.path as osp
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from nala_mm.analysis import KERNELIZED_OPS, build_flop_analyzer, count_flops
from nala_mm.models import DEFAULT_HYBRID, NaLaFormer, NormAwareLinearAttention, SoftmaxAttention
from nala_mm.ops import NaLaConfig, nala_attention, rope_table
from tests.helpers import REPO, tool_env
from tests.reference.released_nalaformer import CLASSIFICATION_TAIL, VARIANTS, released_variant

CHANNELS, HEADS, SIDE = 64, 2, 14
TOKENS, HEAD_DIM = SIDE * SIDE, CHANNELS // HEADS


def layer_input(height: int = SIDE, width: int = SIDE, batch: int = 1,
                channels: int = CHANNELS) -> torch.Tensor:
    return torch.randn(batch, height, width, channels)  # a mixer's channels-last tokens


def analyze(module, handles: bool = True, inputs: torch.Tensor = None):
    inputs = layer_input() if inputs is None else inputs
    analyzer = build_flop_analyzer(module.eval(), (inputs,), attention_handles=handles)
    with torch.no_grad():
        analyzer.total()
    return analyzer


def projections_flops() -> int:
    """Everything around the token mixing, from the layer's definition (one multiply-add each)."""
    n, c = TOKENS, CHANNELS
    qkvg = n * c * 4 * c
    lepe = n * c * 5 * 5  # depthwise: one 5x5 filter per channel
    layer_norm = 5 * n * c  # mmengine: mean, var, normalise, scale, shift
    out_proj = n * c * c
    return qkvg + lepe + layer_norm + out_proj


# Element-wise work the plain reference executes, measured op by op at the aten level: each
# arithmetic op counts its output elements, each reduction its input elements. Views, copies
# (cat, stack) and the matmuls (counted separately) are left out.
POINTWISE_OPS = {'abs', 'add', 'sub', 'mul', 'div', 'pow', 'neg', 'exp', 'log', 'sqrt', 'rsqrt',
                 'reciprocal', 'tanh', 'cos', 'sin', 'relu', 'sign', 'clamp', 'clamp_min',
                 'clamp_max', 'where', 'square'}
REDUCTION_OPS = {'sum', 'mean', 'linalg_vector_norm', 'norm'}


class ElementwiseCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.total = 0
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.rstrip('_')
        self.seen.add(name)
        if name in POINTWISE_OPS:
            self.total += out.numel()
        elif name in REDUCTION_OPS:
            self.total += args[0].numel()
        return out


def executed_elementwise(batch: int, heads: int, height: int, width: int, head_dim: int,
                         use_rope: bool = True, kernel: str = 'cosine') -> int:
    """Element-wise flops the reference implementation executes for these shapes."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, height * width, head_dim, generator=gen)
               for _ in range(3))
    rope = rope_table(height, width, head_dim) if use_rope else None
    with torch.no_grad(), ElementwiseCounter() as counter:
        nala_attention(q, k, v, NaLaConfig(kernel=kernel), rope, mode='reference')
    assert {'mul', 'tanh', 'cos', 'pow'} <= counter.seen  # the counter saw the feature maps
    return counter.total


def documented_nala_flops(n: int, d: int, groups: int = 1, rope: bool = True) -> Counter:
    """What the kernelised-attention handle charges for NaLa, from nala_mm.analysis.flops's
    module doc: per (batch, head) with feature width 2d (e = 2), matmuls N*2d*d (state) +
    N*2d*d (numerator) + N*2d (normaliser); element-wise N*2d (key mean) + (4 + 4)*N*2d
    (features, 4 flops each) + 2*2*N*2d (RoPE on both features, two multiply-adds each) + N*d
    (scaling by z)."""
    width = 2 * d
    matmul = 2 * n * width * d + n * width
    elementwise = n * width + 8 * n * width + n * d + (4 * n * width if rope else 0)
    return Counter(attn_matmul=groups * matmul, attn_elementwise=groups * elementwise)


@pytest.mark.parametrize('use_rope', [True, False])
def test_nala_layer_total_matches_analytic_count(use_rope):
    n, d = TOKENS, HEAD_DIM
    matmul = HEADS * (2 * n * d * d    # state: (2d x N) @ (N x d)
                      + 2 * n * d * d  # numerator: (N x 2d) @ (2d x d)
                      + 2 * n * d)     # normaliser: (N x 2d) @ (2d x 1)
    analyzer = analyze(NormAwareLinearAttention(CHANNELS, HEADS, use_rope=use_rope))
    ops = analyzer.by_operator()
    assert ops['attn_matmul'] == matmul
    expected = documented_nala_flops(n, d, HEADS, rope=use_rope)
    assert ops['attn_elementwise'] == expected['attn_elementwise']
    # 4 N d^2 + 29 N d per head with RoPE (the module doc's closed form), 21 N d without
    assert matmul + ops['attn_elementwise'] == HEADS * (4 * n * d * d
                                                        + (29 if use_rope else 21) * n * d)
    # the layer is its projections (from their definitions) plus the NaLa core, nothing else
    assert analyzer.total() == projections_flops() + matmul + ops['attn_elementwise']


def test_rope_share_is_two_multiply_adds_per_rotated_element():
    """RoPE's count against what the reference executes: x cos - y sin (and x sin + y cos) is
    two multiplies and one add per output element, i.e. two multiply-adds: exactly 2/3."""
    layer = NormAwareLinearAttention(CHANNELS, HEADS)
    plain = NormAwareLinearAttention(CHANNELS, HEADS, use_rope=False)
    counted = (analyze(layer).by_operator()['attn_elementwise']
               - analyze(plain).by_operator()['attn_elementwise'])
    executed = (executed_elementwise(1, HEADS, SIDE, SIDE, HEAD_DIM, use_rope=True)
                - executed_elementwise(1, HEADS, SIDE, SIDE, HEAD_DIM, use_rope=False))
    assert counted > 0 and 3 * counted == 2 * executed


# (channels, heads, height, width, batch): a base shape and one factor doubled in each other row
SHAPES = [(64, 2, 14, 14, 1), (64, 2, 14, 28, 1), (128, 2, 14, 14, 1), (128, 4, 14, 14, 1),
          (64, 2, 14, 14, 2), (32, 1, 7, 9, 1)]


def nala_ops(channels, heads, height, width, batch, mode='fast', use_rope=True):
    layer = NormAwareLinearAttention(channels, heads, use_rope=use_rope, mode=mode)
    inputs = layer_input(height, width, batch, channels)
    return analyze(layer, handles=mode == 'fast', inputs=inputs).by_operator()


@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'C{}-h{}-{}x{}-B{}'.format(*s))
def test_handle_matmuls_equal_stock_count_of_the_reference(shape):
    """Stock mmengine counts the plain reference's matmuls itself; the handle must agree."""
    fast, reference = nala_ops(*shape), nala_ops(*shape, mode='reference')
    assert fast['attn_matmul'] == reference['matmul'] > 0
    for op in ('linear', 'conv', 'layer_norm'):
        assert fast[op] == reference[op], op


@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'C{}-h{}-{}x{}-B{}'.format(*s))
def test_handle_charges_the_documented_count(shape):
    channels, heads, height, width, batch = shape
    ops = nala_ops(*shape)
    expected = documented_nala_flops(height * width, channels // heads, batch * heads)
    assert (ops['attn_matmul'], ops['attn_elementwise']) == (expected['attn_matmul'],
                                                             expected['attn_elementwise'])


def test_matmul_count_scales_as_four_n_d_squared_per_head():
    base = nala_ops(64, 2, 14, 14, 1)['attn_matmul']
    assert nala_ops(64, 2, 14, 28, 1)['attn_matmul'] == 2 * base  # twice the tokens
    assert nala_ops(64, 2, 14, 14, 2)['attn_matmul'] == 2 * base  # twice the batch
    assert nala_ops(128, 4, 14, 14, 1)['attn_matmul'] == 2 * base  # twice the heads, same d
    # twice the head dim: a d^2 + b d -> 4 a d^2 + 2 b d, so the d^2 coefficient is
    # (m(2d) - 2 m(d)) / (2 d^2); per head it must be 4 N (docs/user_guides/method.md, 'Cost')
    wide = nala_ops(128, 2, 14, 14, 1)['attn_matmul']
    d, heads, n = 32, 2, 14 * 14
    assert (wide - 2 * base) / (2 * d * d) == 4 * n * heads


@pytest.mark.parametrize('use_rope', [True, False])
def test_nala_handle_is_invoked(use_rope):
    layer = NormAwareLinearAttention(CHANNELS, HEADS, use_rope=use_rope)
    stock, ours = analyze(layer, handles=False), analyze(layer)
    for op in KERNELIZED_OPS:  # stock mmengine counts each custom op as 0
        assert stock.unsupported_ops()[op] == 1
        assert op not in ours.unsupported_ops()
    ops = ours.by_operator()
    # the handle adds its two entries and changes nothing else
    assert ours.total() - stock.total() == ops['attn_matmul'] + ops['attn_elementwise']
    assert ops['attn_matmul'] == nala_ops(CHANNELS, HEADS, SIDE, SIDE, 1, 'reference',
                                          use_rope=use_rope)['matmul']


def test_sdpa_handle_matches_analytic_count():
    n, d = TOKENS, HEAD_DIM
    attention = 2 * n * n * d * HEADS  # q k^T and A v
    analyzer = analyze(SoftmaxAttention(CHANNELS, HEADS))
    assert analyzer.by_operator()['sdpa'] == attention
    # RoPE's rotations and the softmax are element-wise: 0 by the convention
    assert analyzer.total() == projections_flops() + attention


def test_count_flops_splits_the_token_mixing_out():
    layer = NormAwareLinearAttention(CHANNELS, HEADS).eval()
    flops = count_flops(layer, (layer_input(),), max_depth=1)
    by_op = flops.by_operator
    expected = documented_nala_flops(TOKENS, HEAD_DIM, HEADS)
    assert by_op['attn_matmul'] == expected['attn_matmul']
    assert by_op['attn_elementwise'] == expected['attn_elementwise']
    assert flops.attention == by_op['attn_matmul'] + by_op['attn_elementwise']
    assert flops.total == projections_flops() + flops.attention
    assert not set(KERNELIZED_OPS) & set(flops.uncounted) and '| module' in flops.table


def backbone_flops(dims, depths, heads, mlp_ratio, nala_stages, height, width,
                   out_indices=(0, 1, 2, 3)) -> Counter:
    """A NaLaFormer backbone's count from its definition (spec §2; docs/user_guides/method.md) at
    mmengine's convention: convs and linears their multiply-adds (no bias), BatchNorm in eval 2 and
    LayerNorm 5 per element, activations, LayerScale and residual adds 0; NaLa as documented,
    softmax as q k^T plus A v."""
    count = Counter()

    def conv(cin, cout, kernel, h, w, groups=1):
        count['conv'] += h * w * cout * (cin // groups) * kernel * kernel

    def conv_bn(cin, cout, h, w):  # 3x3 and BatchNorm
        conv(cin, cout, 3, h, w)
        count['batch_norm'] += 2 * cout * h * w

    half = dims[0] // 2
    h, w = math.ceil(height / 2), math.ceil(width / 2)
    for cin in (3, half, half):
        conv_bn(cin, half, h, w)
    h, w = math.ceil(h / 2), math.ceil(w / 2)
    conv_bn(half, dims[0], h, w)
    for i, (c, depth, nh) in enumerate(zip(dims, depths, heads)):
        n, d, hidden = h * w, c // nh, int(mlp_ratio * c)
        for _ in range(depth):
            conv(c, c, 3, h, w, c)  # cpe1
            conv(c, c, 3, h, w, c)  # cpe2
            count['layer_norm'] += 3 * 5 * n * c  # norm1, norm2, the gate's LayerNorm
            count['linear'] += n * c * 4 * c + n * c * c  # qkvg, out_proj
            conv(c, c, 5, h, w, c)  # LePE
            if i in nala_stages:
                count.update(documented_nala_flops(n, d, nh))
            else:
                count['sdpa'] += nh * 2 * n * n * d
            count['linear'] += 2 * n * c * hidden  # fc1, fc2
            conv(hidden, hidden, 3, h, w, hidden)  # the FFN's depthwise conv
        if i in out_indices:
            count['layer_norm'] += 5 * n * c
        if i < 3:
            h, w = math.ceil(h / 2), math.ceil(w / 2)
            conv_bn(c, dims[i + 1], h, w)
    return count


@pytest.mark.parametrize('mixers', [DEFAULT_HYBRID,
                                    ('softmax', 'nala', 'nala', 'nala')])
def test_backbone_count_is_the_sum_of_its_layers(mixers):
    arch = dict(embed_dims=(16, 32, 48, 64), depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 4),
                mlp_ratios=(3.5,) * 4)
    model = NaLaFormer(arch=arch, mixers=mixers, out_indices=(1, 3)).eval()
    flops = count_flops(model, (torch.randn(1, 3, 61, 90),))
    expected = backbone_flops(arch['embed_dims'], arch['depths'], arch['num_heads'], 3.5,
                              [i for i, m in enumerate(mixers) if m == 'nala'], 61, 90,
                              out_indices=(1, 3))
    assert flops.by_operator == expected
    assert flops.total == sum(expected.values())


class HeadCounter(TorchFunctionMode):
    """The ops a convolutional decode head runs, at mmengine's convention: convs their
    multiply-adds (no bias), BatchNorm in eval 2 per element, adaptive average pooling 1 per
    input element, bilinear resizing 4 per output element; activations, adds, concatenation
    and dropout 0."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.conv2d:
            self.total += out.shape[0] * out.shape[2] * out.shape[3] * args[1].numel()
        elif func is F.batch_norm:
            self.total += 2 * args[0].numel()
        elif func is F.adaptive_avg_pool2d:
            self.total += args[0].numel()
        elif func is F.interpolate:
            assert kwargs.get('mode') == 'bilinear', kwargs
            self.total += 4 * out.numel()
        return out


@pytest.mark.extended
@pytest.mark.integration  # starts a process
def test_get_flops_tool_on_a_segmentor():
    """NaLaFormer-T + UperNet at 128^2: the parameters from the released model's shapes and the
    head's, the FLOPs from the backbone's definition and the head's ops, to the digits the tool
    prints."""
    proc = subprocess.Popen(
        [sys.executable, osp.join('tools', 'get_flops.py'), 'configs/ade20k_nala_upernet.py',
         '--shape', '128', '128', '--max-depth', '1'], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env=tool_env())

    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'ade20k_nala_upernet.py')).model
    assert cfg.backbone.arch == 't' and cfg.backbone.out_indices == (0, 1, 2, 3)
    nala_stages = [i for i, m in enumerate(cfg.backbone.mixers) if m != 'softmax']
    assert nala_stages == [0, 1]
    t = VARIANTS['t']
    with torch.device('meta'):
        released = released_variant('t')
    backbone_params = sum(p.numel() for name, p in released.named_parameters()
                          if not name.startswith(CLASSIFICATION_TAIL)) + 2 * sum(t['dims'])
    init_default_scope('mmseg')
    head = revert_sync_batchnorm(MODELS.build(cfg.decode_head)).eval()
    params = backbone_params + sum(p.numel() for p in head.parameters())  # no auxiliary head
    backbone = backbone_flops(t['dims'], t['depths'], t['heads'], t['mlp_ratio'], nala_stages,
                              128, 128)
    features = [torch.randn(1, c, 128 // s, 128 // s) for c, s in zip(t['dims'], (4, 8, 16, 32))]
    with torch.no_grad(), HeadCounter() as head_flops:
        head(features)
    kernelised = backbone['attn_matmul'] + backbone['attn_elementwise']

    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    giga = lambda flops: f'{flops / 1e9:.3f}'  # noqa: E731
    assert f'\nparams: {params / 1e6:.2f} M\n' in stdout, stdout[-3000:]
    assert f'\nGFLOPs: {giga(sum(backbone.values()) + head_flops.total)}  ' in stdout
    assert (f'kernelised (NaLa / linear) {giga(kernelised)} (matmul '
            f'{giga(backbone["attn_matmul"])}, element-wise {giga(backbone["attn_elementwise"])}),'
            f' softmax SDPA {giga(backbone["sdpa"])}\n') in stdout, stdout[-3000:]
    assert 'counted: segmentor: backbone + neck + decode head (mode=tensor)' in stdout
    assert '| module' in stdout  # mmengine's complexity table


def test_swapped_stock_backbone_counts_its_nala_stages():
    """MiT-B0 widths with NaLa in stages 1-2 at 64x64: 16x16 and 8x8 tokens, head dim 32; the
    NaLa node's matmul work is 4*N*d^2 + 2*N*d per head and block (docs/user_guides/method.md,
    'Cost'), and the stock stages' attention still counts (bmm)."""
    from nala_mm.models.swap import NaLaMixVisionTransformer
    model = NaLaMixVisionTransformer(mixers=DEFAULT_HYBRID,
                                     embed_dims=32, num_layers=[2, 2, 2, 2],
                                     num_heads=[1, 2, 5, 8]).eval()
    count = count_flops(model, (torch.randn(1, 3, 64, 64),))
    stages = [(256, 1), (64, 2)]  # (tokens, heads) of the two NaLa stages, two blocks each
    expected = sum(2 * heads * (4 * tokens * 32 ** 2 + 2 * tokens * 32)
                   for tokens, heads in stages)
    assert count.by_operator['attn_matmul'] == expected
    assert count.by_operator['bmm'] > 0


def test_nala_vit_counts_every_nala_layer_with_its_class_token():
    """A 3-layer ViT of 64 channels (two heads of 32) at 64 x 80: a 4 x 5 patch grid and the
    class token, 21 tokens. Each NaLa layer's node does 4*N*d^2 + 2*N*d matmul work per head
    (docs/user_guides/method.md, 'Cost'); the stock softmax layer is counted apart."""
    from nala_mm.models.swap import NaLaVisionTransformer
    model = NaLaVisionTransformer(mixers=('nala', 'nala', 'softmax'), img_size=(64, 64),
                                  embed_dims=64, num_layers=3, num_heads=2, mlp_ratio=2)
    model.eval()
    count = count_flops(model, (torch.randn(1, 3, 64, 80),))
    tokens, heads, d = 21, 2, 32
    assert count.by_operator['attn_matmul'] == 2 * heads * (4 * tokens * d ** 2 + 2 * tokens * d)
    assert count.attention > count.by_operator['attn_matmul']  # element-wise work on top


def test_vitdet_blocks_count_windows_and_nala_per_block():
    """ViTDet's layout at 128 x 176: an 8 x 11 patch grid, 64 channels, two heads of 32. A
    window-4 block pads the grid to 8 x 12 (six windows of 16 tokens) and projects the padded
    tokens; its SDPA does 2 * 16^2 * d per window and head. A NaLa block: 4*N*d^2 + 2*N*d matmul
    work per head over the 88 tokens; a global SDPA block 2 * N^2 * d per head."""
    from nala_mm.models.swap import NaLaVisionTransformer
    window = dict(type='WindowSoftmaxAttention', window_size=4)
    model = NaLaVisionTransformer(mixers=(window, 'nala', 'sdpa'), img_size=(128, 176),
                                  embed_dims=64, num_layers=3, num_heads=2, mlp_ratio=2,
                                  with_cls_token=False)
    model.eval()
    count = count_flops(model, (torch.randn(1, 3, 128, 176),), max_depth=4)
    tokens, padded, heads, d, c = 88, 96, 2, 32, 64
    window_sdpa = 6 * heads * 16 * 16 * 2 * d
    global_sdpa = heads * tokens * tokens * 2 * d
    assert count.by_operator['sdpa'] == window_sdpa + global_sdpa
    assert count.by_operator['attn_matmul'] == heads * (4 * tokens * d ** 2 + 2 * tokens * d)
    per_block = count.by_module
    assert per_block['layers.0.attn.mixer'] == padded * c * 3 * c + window_sdpa + tokens * c * c
    assert per_block['layers.2.attn.mixer'] == tokens * c * 3 * c + global_sdpa + tokens * c * c
