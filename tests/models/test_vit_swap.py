"""NaLa inside mmseg's VisionTransformer: the untouched path is the parent, the stock weights
carry into the mixers, a NaLa layer is global, the class token, the parent's two traps (the grid
``layer(x)`` does not get, ``frozen_exclude`` applied before the swap), and clear errors."""
import math

import pytest
import torch
from mmseg.models.backbones import VisionTransformer
from mmseg.registry import MODELS as SEG_MODELS

from nala_mm.analysis import analyze_backbone
from nala_mm.models.swap import NaLaVisionTransformer

# a tiny ViT: 3 layers of 64 channels, two heads of 32 (RoPE needs d % 4 == 0)
VIT = dict(img_size=(64, 64), patch_size=16, embed_dims=64, num_layers=3, num_heads=2,
           mlp_ratio=2, out_indices=(0, 2), norm_cfg=dict(type='LN', eps=1e-6))
NALA_01 = ('nala', 'nala', 'softmax')
# written out from mmcv's MultiheadAttention (not from the package): upstream name -> where it
# must land in the mixer ('[:3C]': the first 3C rows of qkvg)
CARRIED = {'attn.in_proj_weight': 'mixer.qkvg.weight[:192]', 'attn.in_proj_bias':
           'mixer.qkvg.bias[:192]', 'attn.out_proj.weight': 'mixer.out_proj.weight',
           'attn.out_proj.bias': 'mixer.out_proj.bias'}
NEW = {'mixer.qkvg.weight[192:]', 'mixer.qkvg.bias[192:]', 'mixer.lepe.weight',
       'mixer.lepe.bias', 'mixer.ln.weight', 'mixer.ln.bias'}


def stock(**kwargs) -> VisionTransformer:
    model = VisionTransformer(**dict(VIT, **kwargs))
    model.init_weights()
    return model


def outputs(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


def save_stock(model, path) -> str:
    """As mmseg's vit2mmseg writes a converted ViT: a bare state dict."""
    torch.save(model.state_dict(), path)
    return str(path)


@pytest.mark.parametrize('cls_token', [True, False])
def test_softmax_everywhere_is_the_stock_vit(cls_token):
    theirs = stock(with_cls_token=cls_token, output_cls_token=cls_token, final_norm=True)
    ours = NaLaVisionTransformer(mixers=('softmax',) * 3, with_cls_token=cls_token,
                                 output_cls_token=cls_token, final_norm=True, **VIT)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 3, 200, 296)
    for a, b in zip(outputs(ours, x), outputs(theirs, x)):
        for p, q in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            assert torch.equal(p, q)


def test_stock_checkpoint_carries_into_the_swapped_layers(tmp_path, caplog):
    theirs = stock()
    path = save_stock(theirs, tmp_path / 'vit.pth')
    ours = NaLaVisionTransformer(mixers=NALA_01, init_cfg=dict(type='Pretrained',
                                                               checkpoint=path), **VIT)
    ours.init_weights()
    state, stock_state = ours.state_dict(), theirs.state_dict()
    for i in (0, 1):
        attn = f'layers.{i}.attn'
        mixer = ours.layers[i].attn.mixer
        assert torch.equal(mixer.qkvg.weight[:192], stock_state[f'{attn}.attn.in_proj_weight'])
        assert torch.equal(mixer.qkvg.bias[:192], stock_state[f'{attn}.attn.in_proj_bias'])
        assert torch.equal(mixer.out_proj.weight, stock_state[f'{attn}.attn.out_proj.weight'])
        assert torch.equal(mixer.out_proj.bias, stock_state[f'{attn}.attn.out_proj.bias'])
        report = ours.carry_over_report
        assert set(report.carried[attn]) == {(f'{attn}.{s}', f'{attn}.{d}')
                                             for s, d in CARRIED.items()}
        assert report.dropped[attn] == []  # a ViT attention has nothing without a counterpart
        assert set(report.new[attn]) == {f'{attn}.{k}' for k in NEW}
    # the softmax layer, the class token, the positional embedding and the norms: unchanged
    for key, value in stock_state.items():
        if not key.startswith(('layers.0.attn.', 'layers.1.attn.')):
            assert torch.equal(state[key], value), key
    # the log names every layer, and what moved where
    assert sorted(report.carried) == ['layers.0.attn', 'layers.1.attn']
    lines = report.lines(ours.swapped_names, 'layer')
    assert lines[0].startswith('layer 1, 1 block, per block: carried ')
    assert 'attn.in_proj_weight -> mixer.qkvg.weight[:192]' in lines[0]

    x = torch.randn(1, 3, 64, 96)
    before = outputs(ours, x)
    assert [o.shape for o in before] == [o.shape for o in outputs(theirs, x)]
    with torch.no_grad():  # the carried weights are in use
        ours.layers[0].attn.mixer.qkvg.weight[:64] *= 1.5
    assert (outputs(ours, x)[0] - before[0]).abs().max() > 1e-4
    with torch.no_grad():
        ours.layers[1].attn.mixer.out_proj.weight *= 1.5
    assert (outputs(ours, x)[1] - before[1]).abs().max() > 1e-4


def test_a_swapped_checkpoint_loads_as_saved_and_a_foreign_one_is_refused(tmp_path):
    trained = NaLaVisionTransformer(mixers=NALA_01, **VIT)
    trained.init_weights()
    path = tmp_path / 'swapped.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in trained.state_dict().items()}},
               path)
    again = NaLaVisionTransformer(mixers=NALA_01, init_cfg=dict(type='Pretrained',
                                                                checkpoint=str(path)), **VIT)
    again.init_weights()
    for key, value in trained.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    assert len(again.carry_over_report.already_swapped) == 2
    torch.save({'state_dict': {'decode_head.conv_seg.weight': torch.zeros(3)}},
               tmp_path / 'other.pth')
    other = NaLaVisionTransformer(mixers=NALA_01, init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'other.pth')), **VIT)
    with pytest.raises(ValueError, match='no tensor of .*VisionTransformer'):
        other.init_weights()


def test_the_positional_embedding_is_resized_as_the_parent_does(tmp_path):
    """A 224-pixel checkpoint (14 x 14 positions) into a 64-pixel model (4 x 4)."""
    source = stock(img_size=(224, 224))
    path = save_stock(source, tmp_path / 'vit224.pth')
    theirs = VisionTransformer(init_cfg=dict(type='Pretrained', checkpoint=path), **VIT)
    theirs.init_weights()
    ours = NaLaVisionTransformer(mixers=NALA_01, init_cfg=dict(type='Pretrained',
                                                               checkpoint=path), **VIT)
    ours.init_weights()
    assert ours.pos_embed.shape == (1, 17, 64)
    assert torch.equal(ours.pos_embed, theirs.pos_embed)
    assert torch.equal(ours.cls_token, source.cls_token)


@pytest.mark.parametrize('cls_token', [True, False])
def test_the_mixers_get_the_patch_grid_the_parent_does_not_pass(cls_token):
    """200 x 296 pixels at patch 16 with corner padding: a 13 x 19 grid, and the class token
    (when there is one) as the one prefix token."""
    model = NaLaVisionTransformer(mixers=('nala',) * 3, with_cls_token=cls_token, **VIT)
    seen = []
    model.layers[1].attn.mixer.register_forward_hook(
        lambda m, args, kwargs, out: seen.append((args[0].shape, kwargs)), with_kwargs=True)
    outs = outputs(model, torch.randn(1, 3, 200, 296))
    shape, kwargs = seen[0]
    assert tuple(shape) == (1, int(cls_token) + 13 * 19, 64)
    assert kwargs == dict(hw_shape=(13, 19), num_prefix=int(cls_token))
    assert [tuple(o.shape) for o in outs] == [(1, 64, 13, 19)] * 2


def test_frozen_exclude_reaches_the_mixers_added_after_the_parent_froze():
    """The parent applies frozen_exclude in __init__, before the swap adds the mixers."""
    only_mixers = NaLaVisionTransformer(mixers=NALA_01, frozen_exclude=['mixer'], **VIT)
    trainable = {n for n, p in only_mixers.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in only_mixers.named_parameters() if '.mixer.' in n}
    assert trainable  # the mixers train, everything else is frozen
    pos_only = NaLaVisionTransformer(mixers=NALA_01, frozen_exclude=['pos_embed'], **VIT)
    assert {n for n, p in pos_only.named_parameters() if p.requires_grad} == {'pos_embed'}
    everything = NaLaVisionTransformer(mixers=NALA_01, **VIT)  # ['all']: nothing frozen
    assert all(p.requires_grad for p in everything.parameters())


@pytest.mark.parametrize('cls_token', [True, False])
@pytest.mark.parametrize('size', [(224, 224), (200, 296)])
def test_forward_and_backward_are_finite(cls_token, size):
    model = NaLaVisionTransformer(mixers=NALA_01, with_cls_token=cls_token, drop_path_rate=0.1,
                                  with_cp=True, **VIT)
    model.init_weights()
    model.train()
    x = torch.randn(2, 3, *size, requires_grad=True)
    outs = model(x)
    sum(o.square().mean() for o in outs).backward()
    assert all(torch.isfinite(o).all() for o in outs)
    grads = [p.grad for n, p in model.named_parameters() if '.mixer.' in n]
    assert len(grads) == 2 * 8 and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


@pytest.mark.parametrize('cls_token', [True, False])
def test_a_nala_layer_is_global(cls_token):
    """A corner patch perturbed: a NaLa layer's output changes at the opposite corner of a
    14 x 14 grid; the control mixer (no token mixing) leaves it as it was."""
    reach = {}
    for label, mixer in (('nala', 'nala'), ('control', dict(type='IdentityAttention'))):
        model = NaLaVisionTransformer(mixers=(mixer,) * 3, with_cls_token=cls_token, **VIT)
        model.init_weights()
        model.eval()
        layer = model.layers[0]
        model._grid.hw_shape = (14, 14)
        tokens = torch.randn(1, int(cls_token) + 196, 64)
        moved = tokens.clone()
        moved[0, int(cls_token)] += 3.0 * torch.randn(64)  # the top-left patch
        with torch.no_grad():
            change = (layer(moved) - layer(tokens))[0, -1].abs().max().item()
        reach[label] = change
    assert reach['nala'] > 1e-6
    assert reach['control'] == 0.0


def test_the_class_token_attends_and_is_attended_outside_lepe_and_rope():
    """NaLa: the class token's row reaches every patch and every patch's row gives it weight,
    and RoPE leaves its q and k unrotated (identity rows). Outside LePE: with the control mixer
    (no token mixing) a patch change never reaches the class token's output nor the other way
    round, while LePE still moves a patch's neighbours."""
    model = NaLaVisionTransformer(mixers=('nala',) * 3, **VIT)
    model.eval()  # (mmseg's ViT.train returns None)
    mixer = model.layers[0].attn.mixer
    tokens = torch.randn(1, 1 + 4 * 5, 64)
    with torch.no_grad():
        q, k, v, _, (cos, sin) = mixer.project(tokens, (4, 5), 1)
        assert torch.equal(cos[0], torch.ones_like(cos[0]))
        assert torch.equal(sin[0], torch.zeros_like(sin[0]))
        assert not torch.equal(cos[1:], torch.ones_like(cos[1:]))
        weights = mixer.attention_weights(q, k, None)  # rows without RoPE: distributions
        assert (weights[0, :, 0, 1:] > 0).all() and (weights[0, :, 1:, 0] > 0).all()

        control = NaLaVisionTransformer(mixers=(dict(type='IdentityAttention'),) * 3,
                                        **VIT).layers[0].attn.mixer.eval()
        base = control(tokens, hw_shape=(4, 5), num_prefix=1)
        patch, cls = tokens.clone(), tokens.clone()
        patch[0, 1] += 3.0 * torch.randn(64)  # the top-left patch
        cls[0, 0] += 3.0 * torch.randn(64)
        from_patch = (control(patch, hw_shape=(4, 5), num_prefix=1) - base)[0].abs().amax(-1)
        from_cls = (control(cls, hw_shape=(4, 5), num_prefix=1) - base)[0].abs().amax(-1)
        assert from_patch[0] == 0 and from_patch[2] > 0  # its right neighbour, through LePE
        assert from_cls[0] > 0 and (from_cls[1:] == 0).all()
    with pytest.raises(ValueError, match='21 tokens are not 2 prefix tokens and the 4x5 grid'):
        mixer(tokens, hw_shape=(4, 5), num_prefix=2)


def test_mixers_is_required_and_names_the_layer_count():
    with pytest.raises(TypeError, match='mixers'):
        NaLaVisionTransformer(**VIT)
    with pytest.raises(ValueError, match=r'mixers needs 3 entries \(one per layer\)'):
        NaLaVisionTransformer(mixers=('nala',) * 12, **VIT)
    with pytest.raises(ValueError, match="unknown mixer 'windows'"):
        NaLaVisionTransformer(mixers=('nala', 'windows', 'softmax'), **VIT)
    assert SEG_MODELS.get('NaLaVisionTransformer') is NaLaVisionTransformer


def test_the_attention_statistics_cover_the_class_token():
    model = NaLaVisionTransformer(mixers=NALA_01, **VIT)
    model.init_weights()
    model.eval()
    stats = analyze_backbone(model, torch.randn(1, 3, 64, 80), points=[(70.0, 10.0)])
    assert list(stats) == ['layers.0.attn.mixer', 'layers.1.attn.mixer']
    first = stats['layers.0.attn.mixer']
    assert (first.stage, first.grid, first.num_prefix, first.tokens) == (0, (4, 5), 1, 21)
    assert first.entropy.size == 2 * 21  # every query, the class token's included
    assert first.query_tokens == [(0, 4)] and first.maps[0].shape == (4, 5)
    assert 0 < first.prefix_weights[0] < 1
    assert 0 < first.prefix_entropy <= math.log(21) + 1e-6
    entry = first.summary('layers.0.attn.mixer')
    assert entry['prefix_tokens'] == 1 and entry['tokens'] == 21
    assert model.stage_of('layers.2.ffn') == 2 and model.stage_of('patch_embed') is None
