"""A swapped backbone's pretrained checkpoint loads exactly or refuses, in every family: a tensor
of another shape than the model's raises, naming it, both shapes and the file, wherever it is
(a swapped unit's attention, a kept stock unit's, outside the attention, a model whose units all
keep the stock module); ``pretrained_mismatch='skip'`` loads the rest and keeps it as
initialised. Also Swin's position tables: ``absolute_pos_embed`` and a window change."""
import logging
import re
from typing import Dict, NamedTuple, Tuple

import pytest
import torch

from nala_mm.models.swap import (
    DetNaLaSwinTransformer,
    NaLaMixVisionTransformer,
    NaLaPyramidVisionTransformerV2,
    NaLaVisionTransformer,
    SegNaLaSwinTransformer,
)
from tests.helpers import LogRecords

SWIN = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))
MIT = dict(embed_dims=16, num_layers=[1, 1, 1, 1], num_heads=[1, 1, 2, 2])
VIT = dict(img_size=(64, 64), patch_size=16, embed_dims=32, num_layers=2, num_heads=1,
           mlp_ratio=2)
STAGE_1 = ('nala', 'softmax', 'softmax', 'softmax')  # one swapped unit, the others stock


class Family(NamedTuple):
    cls: type
    kwargs: dict
    mixers: tuple
    new: int            # whole tensors of the model that no stock file holds (LePE, mixer LN)
    swapped_qkv: str    # (a) a swapped unit's q/k/v, as the stock file names it ...
    swapped_into: str   # ... and the model tensor it is carried into
    stock_proj: str     # (b) a kept stock unit's output projection
    outside: str        # (c) the patch embedding: 4 input channels in the file, 3 in the model
    fitting: str        # a tensor that fits, so loads in every case


SWIN_KEYS = ('stages.0.blocks.0.attn.w_msa.qkv.weight', 'stages.0.blocks.0.attn.mixer.qkvg.weight',
             'stages.1.blocks.0.attn.w_msa.proj.weight', 'patch_embed.projection.weight',
             'stages.1.blocks.0.ffn.layers.0.0.weight')
SR_KEYS = ('layers.0.1.0.attn.attn.in_proj_weight', 'layers.0.1.0.attn.mixer.qkvg.weight',
           'layers.1.1.0.attn.attn.out_proj.weight', 'layers.0.0.projection.weight',
           'layers.1.1.0.ffn.layers.0.weight')
VIT_KEYS = ('layers.0.attn.attn.in_proj_weight', 'layers.0.attn.mixer.qkvg.weight',
            'layers.1.attn.attn.out_proj.weight', 'patch_embed.projection.weight',
            'layers.1.ffn.layers.0.0.weight')
# ViTDet: a window block holds the stock layout, q/k/v moved as they are into mixer.qkv
VITDET_KEYS = (VIT_KEYS[0], 'layers.0.attn.mixer.qkv.weight') + VIT_KEYS[2:]
WINDOW_2 = dict(type='WindowSoftmaxAttention', window_size=2)

FAMILIES = {
    'mmseg-swin': Family(SegNaLaSwinTransformer, SWIN, STAGE_1, 4, *SWIN_KEYS),
    'mmdet-swin': Family(DetNaLaSwinTransformer, SWIN, STAGE_1, 4, *SWIN_KEYS),
    'mit': Family(NaLaMixVisionTransformer, MIT, STAGE_1, 4, *SR_KEYS),
    'pvtv2': Family(NaLaPyramidVisionTransformerV2, MIT, STAGE_1, 4, *SR_KEYS),
    'vit': Family(NaLaVisionTransformer, VIT, ('nala', 'softmax'), 4, *VIT_KEYS),
    'vitdet': Family(NaLaVisionTransformer, dict(VIT, with_cls_token=False),
                     (WINDOW_2, 'softmax'), 0, *VITDET_KEYS),
}
# where the mis-shaped tensor is: (the file's key, the model tensor that keeps its value)
CASES = {
    'swapped-attention': lambda f: (f.swapped_qkv, f.swapped_into),
    'stock-attention': lambda f: (f.stock_proj, f.stock_proj),
    'outside-attention': lambda f: (f.outside, f.outside),
    'all-units-stock': lambda f: (f.outside, f.outside),
}


def stock_file(family: Family, path) -> Dict[str, torch.Tensor]:
    """The stock parent's tensors, as mmseg/mmdet publish a backbone: ``backbone.`` keys."""
    state = family.cls.stock_parent()(**family.kwargs).state_dict()
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in state.items()}}, path)
    return state


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """One more input channel: the patch embedding of a 4-channel input, a wider q/k/v."""
    return torch.randn(tensor.shape[0], tensor.shape[1] + 1, *tensor.shape[2:])


def loaded_count(log: LogRecords) -> Tuple[int, int]:
    """``N of M`` of the loader's report line."""
    line, = [m for m in log.messages(logging.INFO) if ' tensors from ' in m]
    return tuple(map(int, re.search(r'(\d+) of (\d+) tensors from ', line).groups()))


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('name', FAMILIES)
def test_a_mis_shaped_tensor_raises_or_with_skip_keeps_its_initialisation(name, case, tmp_path):
    family = FAMILIES[name]
    key, kept = CASES[case](family)
    mixers = ('softmax',) * len(family.mixers) if case == 'all-units-stock' else family.mixers
    path = str(tmp_path / 'stock.pth')
    file = stock_file(family, path)
    expected, bad = tuple(file[key].shape), widened(file[key])
    file[key] = bad
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in file.items()}}, path)
    named = f'{key} {tuple(bad.shape)} vs model {expected}'
    init_cfg = dict(type='Pretrained', checkpoint=path)

    model = family.cls(mixers=mixers, init_cfg=init_cfg, **family.kwargs)
    with pytest.raises(ValueError) as error:
        model.init_weights()
    assert named in str(error.value) and path in str(error.value), str(error.value)

    model = family.cls(mixers=mixers, init_cfg=init_cfg, pretrained_mismatch='skip',
                       **family.kwargs)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with LogRecords() as log:
        model.init_weights()
    state = model.state_dict()
    assert torch.equal(state[kept], initial[kept])  # skipped: as initialised
    assert not torch.equal(initial[family.fitting], file[family.fitting])
    assert torch.equal(state[family.fitting], file[family.fitting])  # the rest loaded
    assert any(named in m and path in m for m in log.messages(logging.WARNING))
    # everything the file holds for the model, less the new tensors and the skipped one
    new = 0 if case == 'all-units-stock' else family.new
    assert loaded_count(log) == (len(state) - new - 1, len(state))


@pytest.mark.parametrize('cls', [SegNaLaSwinTransformer, DetNaLaSwinTransformer])
def test_swin_loads_absolute_pos_embed_and_refuses_another_grid(cls, tmp_path):
    """mmseg's and mmdet's parameter is ``(1, L, C)``, the checkpoint's layout (the stock
    ``init_weights`` reshapes for a 4-D one and fails on it): it loads as saved, with a swapped
    stage and with every stage stock; a table of another grid raises."""
    kwargs = dict(SWIN, use_abs_pos_embed=True, pretrain_img_size=64)
    stock = cls.stock_parent()(**kwargs)
    stock.init_weights()  # a random table: the constructor's is zeros
    path = str(tmp_path / 'stock.pth')
    torch.save({'state_dict': stock.state_dict()}, path)
    for mixers in (STAGE_1, ('softmax',) * 4):
        model = cls(mixers=mixers, init_cfg=dict(type='Pretrained', checkpoint=path), **kwargs)
        model.init_weights()
        assert torch.equal(model.absolute_pos_embed, stock.absolute_pos_embed)
    coarser = dict(kwargs, pretrain_img_size=32)
    model = cls(mixers=STAGE_1, init_cfg=dict(type='Pretrained', checkpoint=path), **coarser)
    with pytest.raises(ValueError, match=r'absolute_pos_embed \(1, 256, 16\) vs model '
                                         r'\(1, 64, 16\)'):
        model.init_weights()


def test_a_swin_checkpoint_of_another_window_loads_its_resized_tables(tmp_path):
    """Window 7 into window 4: the stock stages' tables are resized (not refused); the index,
    a function of the window, is the model's own."""
    path = str(tmp_path / 'window7.pth')
    file = stock_file(FAMILIES['mmseg-swin'], path)
    model = SegNaLaSwinTransformer(mixers=STAGE_1, window_size=4, init_cfg=dict(
        type='Pretrained', checkpoint=path), **SWIN)
    index = model.state_dict()['stages.1.blocks.0.attn.w_msa.relative_position_index'].clone()
    model.init_weights()
    state = model.state_dict()
    table = state['stages.1.blocks.0.attn.w_msa.relative_position_bias_table']
    assert table.shape == (49, 1) and file['stages.1.blocks.0.attn.w_msa.'
                                           'relative_position_bias_table'].shape == (169, 1)
    assert torch.equal(state['stages.1.blocks.0.attn.w_msa.relative_position_index'], index)
    assert torch.equal(state['stages.1.blocks.0.ffn.layers.0.0.weight'],
                       file['stages.1.blocks.0.ffn.layers.0.0.weight'])


def test_a_bad_pretrained_mismatch_is_named():
    with pytest.raises(ValueError, match=r"pretrained_mismatch='warn'; expected one of "
                                         r"\('raise', 'skip'\)"):
        SegNaLaSwinTransformer(pretrained_mismatch='warn', **SWIN)
