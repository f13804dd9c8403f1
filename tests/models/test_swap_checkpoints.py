"""Swin's position tables in a swapped Swin's pretrained checkpoint: ``absolute_pos_embed`` and a
window change; and a bad ``pretrained_mismatch``. That a mis-shaped tensor of a stock checkpoint
raises or, with ``pretrained_mismatch='skip'``, keeps its initialisation, is a contract of every
swapped family (tests/contracts/test_families.py)."""
import pytest
import torch

from nala_mm.models.swap import DetNaLaSwinTransformer, SegNaLaSwinTransformer
from tests.contracts.zoo import STAGE_1, SWIN


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
    file = SegNaLaSwinTransformer.stock_parent()(**dict(SWIN, window_size=7)).state_dict()
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in file.items()}}, path)
    model = SegNaLaSwinTransformer(mixers=STAGE_1, init_cfg=dict(
        type='Pretrained', checkpoint=path), **dict(SWIN, window_size=4))
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
