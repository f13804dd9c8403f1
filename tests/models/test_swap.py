"""NaLa inside mmseg's/mmdet's stock backbones: exactness of the untouched path, the weight
carry-over from a stock checkpoint, global reach of a swapped stage, and clear errors."""
from typing import Callable, Dict, NamedTuple, Sequence, Set, Tuple

import pytest
import torch
from mmdet.models.backbones import PyramidVisionTransformerV2
from mmdet.models.backbones import SwinTransformer as DetSwinTransformer
from mmdet.registry import MODELS as DET_MODELS
from mmseg.models.backbones import MixVisionTransformer
from mmseg.models.backbones import SwinTransformer as SegSwinTransformer
from mmseg.registry import MODELS as SEG_MODELS

from nala_mm.models import DEFAULT_HYBRID
from nala_mm.models.swap import (
    DetNaLaSwinTransformer,
    NaLaMixVisionTransformer,
    NaLaPyramidVisionTransformerV2,
    SegNaLaSwinTransformer,
)

SWIN_ARGS = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7)
MIT_ARGS = dict(embed_dims=32, num_layers=[2, 2, 2, 2], num_heads=[1, 2, 5, 8])
# written out from mmseg's WindowMSA and mmcv's MultiheadAttention (not from the package):
# upstream name -> where it must land in the mixer ('[:3C]': the first 3C rows of qkvg)
SWIN_CARRIED = {'w_msa.qkv.weight': 'mixer.qkvg.weight[:3C]', 'w_msa.qkv.bias':
                'mixer.qkvg.bias[:3C]', 'w_msa.proj.weight': 'mixer.out_proj.weight',
                'w_msa.proj.bias': 'mixer.out_proj.bias'}
MHA_CARRIED = {'attn.in_proj_weight': 'mixer.qkvg.weight[:3C]', 'attn.in_proj_bias':
               'mixer.qkvg.bias[:3C]', 'attn.out_proj.weight': 'mixer.out_proj.weight',
               'attn.out_proj.bias': 'mixer.out_proj.bias'}
NEW = {'mixer.qkvg.weight[3C:]', 'mixer.qkvg.bias[3C:]', 'mixer.lepe.weight', 'mixer.lepe.bias',
       'mixer.ln.weight', 'mixer.ln.bias'}


class Host(NamedTuple):
    swapped: type
    stock: type
    kwargs: dict
    blocks: Callable  # (backbone, stage) -> the stage's blocks
    widths: Sequence[int]
    carried: Dict[str, str]
    dropped: Callable[[int], Set[str]]  # stage -> upstream names with no counterpart


def swin_blocks(model, stage):
    return model.stages[stage].blocks


def mit_blocks(model, stage):
    return model.layers[stage][1]


def sr_dropped(stage: int) -> Set[str]:
    # sr_ratios (8, 4, 2, 1): stages 1-3 reduce keys through sr + norm
    return {'sr.weight', 'sr.bias', 'norm.weight', 'norm.bias'} if stage < 3 else set()


HOSTS = {
    'mmseg-swin': Host(SegNaLaSwinTransformer, SegSwinTransformer, SWIN_ARGS, swin_blocks,
                       (32, 64, 128, 256), SWIN_CARRIED,
                       lambda s: {'w_msa.relative_position_bias_table',
                                  'w_msa.relative_position_index'}),
    'mmdet-swin': Host(DetNaLaSwinTransformer, DetSwinTransformer, SWIN_ARGS, swin_blocks,
                       (32, 64, 128, 256), SWIN_CARRIED,
                       lambda s: {'w_msa.relative_position_bias_table',
                                  'w_msa.relative_position_index'}),
    'mmseg-mit': Host(NaLaMixVisionTransformer, MixVisionTransformer, MIT_ARGS, mit_blocks,
                      (32, 64, 160, 256), MHA_CARRIED, sr_dropped),
    'mmdet-pvtv2': Host(NaLaPyramidVisionTransformerV2, PyramidVisionTransformerV2,
                        MIT_ARGS, mit_blocks, (32, 64, 160, 256), MHA_CARRIED, sr_dropped),
}


def stock_model(host: Host) -> torch.nn.Module:
    model = host.stock(**host.kwargs)
    model.init_weights()
    return model


def save_stock(model: torch.nn.Module, path: str) -> str:
    """As mmseg/mmdet publish converted backbones: a ``state_dict`` with ``backbone.`` keys."""
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in model.state_dict().items()}},
               path)
    return path


def outputs(model, x) -> Tuple[torch.Tensor, ...]:
    model.eval()
    with torch.no_grad():
        return tuple(model(x))


@pytest.mark.parametrize('name', HOSTS)
def test_softmax_everywhere_is_the_stock_backbone(name):
    host = HOSTS[name]
    stock = stock_model(host)
    swapped = host.swapped(mixers=('softmax',) * 4, **host.kwargs)
    assert list(swapped.state_dict()) == list(stock.state_dict())
    swapped.load_state_dict(stock.state_dict(), strict=True)
    x = torch.randn(1, 3, 200, 296)
    for ours, theirs in zip(outputs(swapped, x), outputs(stock, x)):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize('name', HOSTS)
def test_stock_checkpoint_carries_into_the_swapped_stages(name, tmp_path, caplog):
    host = HOSTS[name]
    stock = stock_model(host)
    path = save_stock(stock, str(tmp_path / 'stock.pth'))
    swapped = host.swapped(mixers=DEFAULT_HYBRID, init_cfg=dict(type='Pretrained', checkpoint=path),
                           **host.kwargs)
    swapped.init_weights()
    stock_state, state = stock.state_dict(), swapped.state_dict()

    # the swapped stages hold no relative-position table and no spatial reduction
    for stage in (0, 1):
        prefix = 'stages' if 'swin' in name else 'layers'
        keys = [k for k in state if k.startswith(f'{prefix}.{stage}.')]
        assert keys and not [k for k in keys if 'relative_position' in k or '.attn.sr.' in k
                             or '.attn.norm.' in k]
    # the carried tensors are the stock ones; the untouched stages equal the stock stages
    report = swapped.carry_over_report
    for stage in range(4):
        width = host.widths[stage]
        for index, block in enumerate(host.blocks(swapped, stage)):
            attn = f'{"stages" if "swin" in name else "layers"}.{stage}.' + \
                   (f'blocks.{index}.attn' if 'swin' in name else f'1.{index}.attn')
            if stage >= 2:
                for key in stock_state:
                    if key.startswith(attn + '.'):
                        assert torch.equal(state[key], stock_state[key]), key
                continue
            qkvg = block.attn.mixer.qkvg
            assert torch.equal(qkvg.weight[:3 * width],
                               stock_state[f'{attn}.{_source(host, "[:3C]", "weight")}'])
            assert torch.equal(qkvg.bias[:3 * width],
                               stock_state[f'{attn}.{_source(host, "[:3C]", "bias")}'])
            assert torch.equal(block.attn.mixer.out_proj.weight,
                               stock_state[f'{attn}.{_source(host, "out_proj", "weight")}'])
            # the logged lists are exactly the expectation written out above
            expected_carried = {(f'{attn}.{src}', f'{attn}.{dst}'.replace('3C', str(3 * width)))
                                for src, dst in host.carried.items()}
            assert set(report.carried[attn]) == expected_carried
            assert set(report.dropped[attn]) == {f'{attn}.{k}' for k in host.dropped(stage)}
            assert set(report.new[attn]) == {f'{attn}.{k}'.replace('3C', str(3 * width))
                                             for k in NEW}
    assert sorted(report.carried) == sorted(
        n for n, _ in swapped.named_modules() if hasattr(_, 'mixer') and n.endswith('.attn'))

    # the carried weights are used: changing one q row changes the output
    x = torch.randn(1, 3, 96, 96)
    before = outputs(swapped, x)
    with torch.no_grad():
        host.blocks(swapped, 0)[0].attn.mixer.qkvg.weight[:host.widths[0]] *= 1.5
    after = outputs(swapped, x)
    assert (after[0] - before[0]).abs().max() > 1e-4


def _source(host: Host, marker: str, kind: str) -> str:
    return next(src for src, dst in host.carried.items() if marker in dst and kind in src)


@pytest.mark.parametrize('name', HOSTS)
@pytest.mark.parametrize('size', [(224, 224), (200, 296)])
def test_swapped_forward_and_backward_are_finite(name, size):
    host = HOSTS[name]
    model = host.swapped(mixers=DEFAULT_HYBRID, **host.kwargs)
    model.init_weights()
    model.train()
    x = torch.randn(2, 3, *size, requires_grad=True)
    outs = model(x)
    assert [o.shape[1] for o in outs] == list(host.widths)
    sum(o.square().mean() for o in outs).backward()
    assert all(torch.isfinite(o).all() for o in outs)
    grads = [p.grad for n, p in model.named_parameters() if '.mixer.' in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def _stage_output(name: str, model, stage: int, tokens: torch.Tensor, hw):
    if 'swin' in name:
        return model.stages[stage](tokens, hw)[2]  # the stage's output before patch merging
    for block in model.layers[stage][1]:
        tokens = block(tokens, hw)
    return tokens


@pytest.mark.parametrize('name', HOSTS)
def test_a_swapped_stage_reaches_the_opposite_corner(name):
    """One corner token perturbed: a NaLa stage's output changes at the opposite corner; the
    control mixer (no token mixing) and Swin's windowed attention leave it exactly as it was."""
    host = HOSTS[name]
    side = 28  # 4 Swin windows across; 26 tokens between the corners
    reach = {}
    for label, mixer in [('nala', 'nala'), ('control', dict(type='IdentityAttention')),
                         ('stock', 'softmax')]:
        model = host.swapped(mixers=(mixer,) * 4, **host.kwargs)
        model.init_weights()
        model.eval()
        tokens = torch.randn(1, side * side, host.widths[0])
        moved = tokens.clone()
        moved[0, 0] += 3.0 * torch.randn(host.widths[0])  # not a constant: LN would remove it
        with torch.no_grad():
            base = _stage_output(name, model, 0, tokens, (side, side))
            changed = _stage_output(name, model, 0, moved, (side, side))
        reach[label] = (changed[0, -1] - base[0, -1]).abs().max().item() / \
            base[0, -1].abs().max().item()
    # one token of 784, through small initial weights: small but far above float32 rounding
    # (the control's difference is exactly zero, so any change is the mixing's)
    assert reach['nala'] > 1e-6, reach
    assert reach['control'] == 0.0, reach
    if 'swin' in name:
        assert reach['stock'] == 0.0, reach


def test_each_package_has_its_own_registered_swin():
    assert SEG_MODELS.get('NaLaSwinTransformer') is SegNaLaSwinTransformer
    assert DET_MODELS.get('NaLaSwinTransformer') is DetNaLaSwinTransformer
    assert issubclass(SegNaLaSwinTransformer, SegSwinTransformer)
    assert issubclass(DetNaLaSwinTransformer, DetSwinTransformer)
    assert SEG_MODELS.get('NaLaMixVisionTransformer') is NaLaMixVisionTransformer
    assert DET_MODELS.get('NaLaPyramidVisionTransformerV2') is NaLaPyramidVisionTransformerV2
    # an mmseg config reaches mmdet's PVTv2 by the package prefix
    built = SEG_MODELS.build(dict(type='mmdet.NaLaPyramidVisionTransformerV2', **MIT_ARGS))
    assert isinstance(built, NaLaPyramidVisionTransformerV2)


def test_a_swapped_checkpoint_loads_exactly(tmp_path):
    """A NaLa-swapped model's own checkpoint through ``init_cfg``: every tensor as saved."""
    host = HOSTS['mmseg-swin']
    trained = host.swapped(mixers=DEFAULT_HYBRID, **host.kwargs)
    trained.init_weights()
    path = save_stock(trained, str(tmp_path / 'swapped.pth'))
    again = host.swapped(mixers=DEFAULT_HYBRID, init_cfg=dict(type='Pretrained', checkpoint=path),
                         **host.kwargs)
    again.init_weights()
    for key, value in trained.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    assert len(again.carry_over_report.already_swapped) == 4
    assert not any(again.carry_over_report.carried.values())


def test_official_layouts_are_converted_before_the_carry_over(tmp_path):
    """mmdet's Swin (``convert_weights=True``) and PVTv2 (its default) read the authors' layouts
    through mmdet's converters; q/k/v then land in the mixer. Keys written here in the official
    layouts: Swin's ``layers.i.blocks.j.attn.qkv``, PVT's separate ``q`` and ``kv``."""
    width = 32
    qkv = torch.randn(3 * width, width)
    proj = torch.randn(width, width)
    official_swin = {'layers.0.blocks.0.attn.qkv.weight': qkv,
                     'layers.0.blocks.0.attn.qkv.bias': torch.zeros(3 * width),
                     'layers.0.blocks.0.attn.proj.weight': proj}
    torch.save({'model': official_swin}, tmp_path / 'swin.pth')
    swin = DetNaLaSwinTransformer(mixers=DEFAULT_HYBRID, convert_weights=True, init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'swin.pth')), **SWIN_ARGS)
    swin.init_weights()
    assert torch.equal(swin.stages[0].blocks[0].attn.mixer.qkvg.weight[:3 * width], qkv)
    assert torch.equal(swin.stages[0].blocks[0].attn.mixer.out_proj.weight, proj)

    official_pvt = {'block1.0.attn.q.weight': qkv[:width], 'block1.0.attn.q.bias':
                    torch.ones(width), 'block1.0.attn.kv.weight': qkv[width:],
                    'block1.0.attn.kv.bias': torch.ones(2 * width),
                    'block1.0.attn.proj.weight': proj,
                    'block1.0.attn.sr.weight': torch.randn(width, width, 8, 8)}
    torch.save(official_pvt, tmp_path / 'pvt.pth')
    pvt = NaLaPyramidVisionTransformerV2(mixers=DEFAULT_HYBRID, init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'pvt.pth')), **MIT_ARGS)
    pvt.init_weights()
    mixer = pvt.layers[0][1][0].attn.mixer
    assert torch.equal(mixer.qkvg.weight[:3 * width], qkv)
    assert torch.equal(mixer.qkvg.bias[:3 * width], torch.ones(3 * width))
    assert pvt.carry_over_report.dropped['layers.0.1.0.attn'] == ['layers.0.1.0.attn.sr.weight']


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match=r'mixers needs 4 entries \(one per stage\)'):
        SegNaLaSwinTransformer(mixers=('nala',) * 3, **SWIN_ARGS)
    with pytest.raises(ValueError,
                       match="unknown mixer 'windows'; expected 'softmax' \\(the stock attention"):
        SegNaLaSwinTransformer(mixers=('windows',) * 4, **SWIN_ARGS)
    with pytest.raises(ValueError, match='remove embed_dims'):
        SegNaLaSwinTransformer(mixers=(dict(type='LinearAttention', num_heads=2),) * 4,
                                **SWIN_ARGS)
    # a checkpoint of another width names the tensor and both shapes
    wider = SegSwinTransformer(**dict(SWIN_ARGS, embed_dims=64))
    path = save_stock(wider, str(tmp_path / 'wide.pth'))
    model = SegNaLaSwinTransformer(mixers=DEFAULT_HYBRID, init_cfg=dict(type='Pretrained',
                                                                 checkpoint=path), **SWIN_ARGS)
    with pytest.raises(ValueError, match=r"stages.0.blocks.0.attn.w_msa.qkv.weight.*\(192, 64\)"
                                         r".*\(96, 32\)"):
        model.init_weights()
    # a checkpoint of something else loads nothing: an error, not a silent from-scratch start
    torch.save({'state_dict': {'head.fc.weight': torch.zeros(3, 3)}}, tmp_path / 'other.pth')
    model = SegNaLaSwinTransformer(mixers=DEFAULT_HYBRID, init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'other.pth')), **SWIN_ARGS)
    with pytest.raises(ValueError, match='no tensor of .*other.pth matches'):
        model.init_weights()
