"""ViTDet's parts: the window mixer against an independent windowed attention (padded odd grid,
forward and gradients), the reach of window vs NaLa blocks, the stock checkpoint in the window
mixers, SimpleFPN's five maps, and the layer-decay rates of every parameter."""
import math

import pytest
import torch
from mmdet.registry import MODELS as DET_MODELS
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmseg.models.backbones import VisionTransformer
from torch import nn

from nala_mm.models import SimpleFPN, WindowSoftmaxAttention
from nala_mm.models.swap import NaLaVisionTransformer
from tests.helpers import DEVICES


def windowed_reference(x, qkv_w, qkv_b, proj_w, proj_b, heads, window):
    """ViTDet's windowed attention written out: zero-pad the (B, H, W, C) grid at the bottom and
    right to whole ``window = (rows, cols)`` windows, then for every window and head an explicit
    softmax over the window's tokens (padded ones included, unmasked), then crop."""
    batch, height, width, channels = x.shape
    side_h, side_w = window
    ph, pw = math.ceil(height / side_h) * side_h, math.ceil(width / side_w) * side_w
    padded = x.new_zeros(batch, ph, pw, channels)
    padded[:, :height, :width] = x
    out = torch.zeros_like(padded)
    d = channels // heads
    for top in range(0, ph, side_h):
        for left in range(0, pw, side_w):
            tokens = padded[:, top:top + side_h, left:left + side_w].reshape(batch, -1, channels)
            q, k, v = (tokens @ qkv_w.T + qkv_b).split(channels, dim=-1)
            mixed = []
            for h in range(heads):
                qh, kh, vh = (t[..., h * d:(h + 1) * d] for t in (q, k, v))
                weights = torch.softmax(qh @ kh.transpose(1, 2) / math.sqrt(d), dim=-1)
                mixed.append(weights @ vh)
            mixed = torch.cat(mixed, -1) @ proj_w.T + proj_b
            out[:, top:top + side_h, left:left + side_w] = mixed.reshape(batch, side_h, side_w,
                                                                          -1)
    return out[:, :height, :width]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('mode', ['fast', 'reference'])
@pytest.mark.parametrize('side', [4, 0])
def test_window_mixer_matches_an_independent_windowed_attention(mode, side, device):
    """A 9 x 11 grid in windows of 4 pads to 12 x 12; side 0 is one window over the grid."""
    torch.manual_seed(0)
    mixer = WindowSoftmaxAttention(32, 4, window_size=side, mode=mode).double().to(device)
    x = torch.randn(2, 9, 11, 32, dtype=torch.double, device=device, requires_grad=True)
    ours = mixer(x)
    params = [mixer.qkv.weight, mixer.qkv.bias, mixer.proj.weight, mixer.proj.bias]
    theirs = windowed_reference(x, *params, heads=4, window=(side, side) if side else (9, 11))
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(ours)
    grads = torch.autograd.grad((ours * probe).sum(), [x, *params])
    expected = torch.autograd.grad((theirs * probe).sum(), [x, *params])
    for name, a, b in zip(['input', 'qkv.w', 'qkv.b', 'proj.w', 'proj.b'], grads, expected):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)
    if side:  # the padded tokens are keys, unmasked: the corner's 1 x 3 window attending
        # among its own three tokens alone gives other numbers
        alone = WindowSoftmaxAttention(32, 4, window_size=0).double().to(device)
        alone.load_state_dict(mixer.state_dict())
        assert not torch.allclose(ours[:, 8:, 8:], alone(x[:, 8:, 8:].contiguous()), atol=1e-3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device')
def test_window_mixer_under_fp16_autocast_on_cuda():
    """SDPA's fused half-precision kernels within the padded windows, against float32."""
    mixer = WindowSoftmaxAttention(64, 2, window_size=14).cuda()
    x = torch.randn(2, 30, 45, 64, device='cuda')
    with torch.autocast('cuda', dtype=torch.float16):
        half = mixer(x)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), mixer(x), rtol=2e-2, atol=2e-2)


def tiny_vit(mixers, **kwargs) -> NaLaVisionTransformer:
    model = NaLaVisionTransformer(
        img_size=(128, 128), patch_size=16, embed_dims=64, num_layers=len(mixers), num_heads=2,
        mlp_ratio=2, with_cls_token=False, final_norm=False, out_indices=(len(mixers) - 1,),
        mixers=mixers, **kwargs)
    model.init_weights()
    return model.eval()


WINDOW_4 = dict(type='WindowSoftmaxAttention', window_size=4)


@pytest.mark.parametrize('mixer, reaches', [(WINDOW_4, False), ('nala', True)])
def test_a_corner_reaches_the_opposite_corner_only_through_global_blocks(mixer, reaches):
    """8 x 8 patches, three blocks: windows of 4 never let the top-left patch reach the
    bottom-right one; NaLa blocks do in one."""
    model = tiny_vit([mixer] * 3)
    x = torch.randn(1, 3, 128, 128)
    changed = x.clone()
    changed[..., :16, :16] += 3.0  # the top-left patch only
    with torch.no_grad():
        before, after = model(x)[0], model(changed)[0]
    assert (after[..., 0, 0] - before[..., 0, 0]).abs().max() > 1e-2  # the changed patch
    corner = (after[..., -1, -1] - before[..., -1, -1]).abs().max().item()
    assert (corner > 1e-4) if reaches else (corner == 0.0), corner


def test_stock_checkpoint_loads_into_window_and_sdpa_blocks_unchanged(tmp_path):
    """With windows as large as the grid, ViTDet's layout computes the stock ViT's function:
    the carried q/k/v and projection are the stock tensors, moved as they are."""
    vit = dict(img_size=(128, 128), patch_size=16, embed_dims=64, num_layers=3, num_heads=2,
               mlp_ratio=2, with_cls_token=False, final_norm=False, out_indices=(2,))
    stock = VisionTransformer(**vit)
    stock.init_weights()
    path = tmp_path / 'vit.pth'
    torch.save(stock.state_dict(), path)
    whole_grid = dict(type='WindowSoftmaxAttention', window_size=8)
    ours = NaLaVisionTransformer(mixers=[whole_grid, whole_grid, 'sdpa'],
                                 init_cfg=dict(type='Pretrained', checkpoint=str(path)), **vit)
    ours.init_weights()
    report = ours.carry_over_report
    assert report.carried['layers.0.attn'] == [
        ('layers.0.attn.attn.in_proj_weight', 'layers.0.attn.mixer.qkv.weight'),
        ('layers.0.attn.attn.in_proj_bias', 'layers.0.attn.mixer.qkv.bias'),
        ('layers.0.attn.attn.out_proj.weight', 'layers.0.attn.mixer.proj.weight'),
        ('layers.0.attn.attn.out_proj.bias', 'layers.0.attn.mixer.proj.bias')]
    assert report.new['layers.2.attn'] == [] and report.dropped['layers.2.attn'] == []
    x = torch.randn(2, 3, 128, 128)
    assert stock.eval() is None and ours.eval() is ours  # mmseg's train() returns None
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], stock(x)[0], rtol=1e-5, atol=1e-5)


def test_the_window_mixer_refuses_a_class_token():
    with pytest.raises(ValueError, match='num_prefix=1'):
        NaLaVisionTransformer(img_size=(64, 64), patch_size=16, embed_dims=64, num_layers=1,
                              num_heads=2, mixers=['window'])(torch.randn(1, 3, 64, 64))


@pytest.mark.parametrize('device', DEVICES)
def test_simple_fpn_gives_five_maps_at_strides_4_to_64(device):
    init_default_scope('mmdet')
    neck = DET_MODELS.build(dict(type='SimpleFPN', in_channels=768, out_channels=256)).to(device)
    assert isinstance(neck, SimpleFPN)
    # the stride-16 map of a 256 x 256 image
    outs = neck((torch.randn(1, 768, 16, 16, device=device),))
    assert [tuple(o.shape) for o in outs] == [(1, 256, 256 // s, 256 // s)
                                              for s in (4, 8, 16, 32, 64)]
    with pytest.raises(ValueError, match='expected a \\(B, 768, H, W\\) map'):
        neck((torch.randn(1, 384, 16, 16, device=device),))


def test_simple_fpn_takes_a_patch_8_map_to_the_same_strides():
    """scale_factors (2, 1, 1/2, 1/4): a patch-8 ViT's stride-8 map gives strides 4 to 64, so
    the RPN's anchors and the RoI extractors keep mmdet's strides; the stride-4 branch is one
    transposed convolution at half the channels, stride 32 a 4x4 max-pool."""
    init_default_scope('mmdet')
    neck = DET_MODELS.build(dict(type='SimpleFPN', in_channels=64, out_channels=32,
                                 scale_factors=(2, 1, 0.5, 0.25)))
    x = torch.randn(1, 64, 24, 24)  # the stride-8 map of a 192 x 192 image
    outs = neck((x,))
    assert [tuple(o.shape) for o in outs] == [(1, 32, 192 // s, 192 // s)
                                              for s in (4, 8, 16, 32, 64)]
    assert neck.lateral[0].conv.in_channels == 32 and neck.lateral[3].conv.in_channels == 64
    pooled = neck.output[3](neck.lateral[3](x.reshape(1, 64, 6, 4, 6, 4).amax((3, 5))))
    torch.testing.assert_close(outs[3], pooled)
    with pytest.raises(ValueError, match=r'scale_factors must be one of .* got \(8, 4, 2, 1\)'):
        SimpleFPN(64, scale_factors=(8, 4, 2, 1))


class TinyDetector(nn.Module):
    """backbone (a 2-layer NaLa ViT) + a neck, as mmdet names them."""

    def __init__(self):
        super().__init__()
        self.backbone = tiny_vit(['window', 'nala'])
        self.neck = nn.Sequential(nn.Conv2d(64, 8, 1), nn.GroupNorm(2, 8))


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_layer_decay_rate_and_weight_decay_of_every_parameter(scope):
    init_default_scope(scope)  # the constructor is found from either package's configs
    model = TinyDetector()
    wrapper = build_optim_wrapper(model, dict(
        type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.1),
        constructor='ViTLayerDecayOptimWrapperConstructor', paramwise_cfg=dict(decay_rate=0.5)))
    got = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            got[names[id(p)]] = (group['lr'], group['weight_decay'])
    # lr = 0.5 ** (3 - layer): embeddings 0.125, layers.0 0.25, layers.1 0.5, the rest 1
    expected = {
        'backbone.cls_token': (0.125, 0.0), 'backbone.pos_embed': (0.125, 0.0),
        'backbone.patch_embed.projection.weight': (0.125, 0.1),
        'neck.0.weight': (1.0, 0.1), 'neck.0.bias': (1.0, 0.0),
        'neck.1.weight': (1.0, 0.0), 'neck.1.bias': (1.0, 0.0),
    }
    block = {  # per layer: the block norms, MLP, and the mixer (window: qkv/proj; NaLa: gated)
        'ln1.weight': 0.0, 'ln1.bias': 0.0, 'ln2.weight': 0.0, 'ln2.bias': 0.0,
        'ffn.layers.0.0.weight': 0.1, 'ffn.layers.0.0.bias': 0.0,
        'ffn.layers.1.weight': 0.1, 'ffn.layers.1.bias': 0.0}
    window = {'attn.mixer.qkv.weight': 0.1, 'attn.mixer.qkv.bias': 0.0,
              'attn.mixer.proj.weight': 0.1, 'attn.mixer.proj.bias': 0.0}
    nala = {'attn.mixer.qkvg.weight': 0.1, 'attn.mixer.qkvg.bias': 0.0,
            'attn.mixer.lepe.weight': 0.1, 'attn.mixer.lepe.bias': 0.0,
            'attn.mixer.ln.weight': 0.0, 'attn.mixer.ln.bias': 0.0,
            'attn.mixer.out_proj.weight': 0.1, 'attn.mixer.out_proj.bias': 0.0}
    for layer, (lr, mixer) in enumerate([(0.25, window), (0.5, nala)]):
        for name, wd in {**block, **mixer}.items():
            expected[f'backbone.layers.{layer}.{name}'] = (lr, wd)
    assert got == expected


def test_layer_decay_refuses_a_backbone_without_layers():
    with pytest.raises(TypeError, match='backbone.layers'):
        build_optim_wrapper(nn.Module(), dict(
            type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0),
            constructor='ViTLayerDecayOptimWrapperConstructor',
            paramwise_cfg=dict(decay_rate=0.5)))
    with pytest.raises(ValueError, match='decay_rate'):
        build_optim_wrapper(TinyDetector(), dict(
            type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0),
            constructor='ViTLayerDecayOptimWrapperConstructor',
            paramwise_cfg=dict(decay_rate=1.5)))
