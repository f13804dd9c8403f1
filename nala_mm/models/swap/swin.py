"""The Swin family: NaLa inside mmseg's and mmdet's ``SwinTransformer``, one mixer per stage.

Everything Swin-specific is here: where a stage's blocks are (``stages[i].blocks``), the module
that takes a ``ShiftWindowMSA``'s place (:class:`WindowFreeAttention`: no window partition,
shift or window padding), the upstream attention layout that carries over, and the softmax
stages' relative-position tables resized to the model's window.
Registered: ``NaLaSwinTransformer`` in mmseg's registry; mmdet's, a subclass of mmdet's parent
with its ``convert_weights``, is :class:`.detection.DetNaLaSwinTransformer`.
"""
from typing import Dict, Mapping, Sequence

import torch
from mmseg.models.backbones import SwinTransformer as MMSegSwinTransformer
from torch import Tensor

from ...registry import register_model
from ..mixer_specs import build_mixer
from .base import AttentionLayout, SwappedAttention, SwappedAttentionMixin

# mmseg's / mmdet's ShiftWindowMSA (``attn``) -> WindowMSA (``w_msa``) with ``qkv`` and ``proj``
SWIN_WINDOW_ATTENTION = AttentionLayout('w_msa.qkv.weight', 'w_msa.qkv.bias',
                                        'w_msa.proj.weight', 'w_msa.proj.bias')


class WindowFreeAttention(SwappedAttention):
    """Swin's ``ShiftWindowMSA`` slot, ``forward(query, hw_shape) -> branch``: the mixer attends
    over the whole stage, with no window partition, shift or window padding. As upstream, the
    output projection's dropout and the block's DropPath follow, and the block adds the
    residual."""

    def forward(self, query: Tensor, hw_shape: Sequence[int]) -> Tensor:
        return self.branch(query, hw_shape)


def resize_relative_position_tables(state: Dict[str, Tensor],
                                    model_state: Mapping[str, Tensor]) -> Dict[str, Tensor]:
    """Swin's softmax stages: bicubic-resize a pretrained relative-position table to the
    model's window, as the stock Swin's ``init_weights`` does. A table of another number of
    heads is left as it is (the stock Swin skips it), for the loader's shape check. Beside a
    resized table, the checkpoint's ``relative_position_index`` of the other window is dropped:
    the index is no weight but a function of the window, which the model built for its own
    (the stock Swin's load fails on it)."""
    for key in [k for k in state if k.endswith('relative_position_bias_table')]:
        if key not in model_state:
            continue
        table, current = state[key], model_state[key]
        if table.shape[1] == current.shape[1] and table.shape[0] != current.shape[0]:
            side, new_side = round(table.shape[0] ** 0.5), round(current.shape[0] ** 0.5)
            grid = table.permute(1, 0).reshape(1, table.shape[1], side, side)
            grid = torch.nn.functional.interpolate(grid, size=(new_side, new_side),
                                                   mode='bicubic')
            state[key] = grid.reshape(current.shape[1], -1).permute(1, 0).contiguous()
            index = key.replace('relative_position_bias_table', 'relative_position_index')
            if index in state and index in model_state and \
                    state[index].shape != model_state[index].shape:
                del state[index]
    return state


class SwinStages(SwappedAttentionMixin):
    """Swin (mmseg's or mmdet's): blocks in ``stages[i].blocks``; a swapped block's
    ``ShiftWindowMSA`` becomes a window-free global mixer."""
    attention_layout = SWIN_WINDOW_ATTENTION

    def _num_units(self):
        return len(self.stages)

    def _unit_blocks(self, unit):
        return self.stages[unit].blocks

    def _global_attention(self, stock, mixer_cfg):
        window_msa = stock.w_msa
        mixer = build_mixer(mixer_cfg, window_msa.embed_dims, window_msa.num_heads, self.mode)
        return WindowFreeAttention(mixer, proj_drop=window_msa.proj_drop, drop_path=stock.drop)

    def adapt_state(self, state, model_state):
        return resize_relative_position_tables(state, model_state)


SWIN_ARGS_DOC = """
    Args:
        mixers: one entry per stage: ``'softmax'`` keeps Swin's shifted-window attention
            untouched; ``'nala'``, ``'linear'`` or a registered mixer's config put that mixer,
            attending over the whole stage, in every block of the stage. Default: NaLa in the
            two high-resolution stages, as released.
        mode: ``'fast'`` or ``'reference'`` for every swapped mixer (:mod:`nala_mm.ops.mode`).
        pretrained_mismatch: what a tensor of the ``Pretrained`` checkpoint whose shape differs
            from the model's (after the carry-over and the resizing of relative-position
            tables) does: ``'raise'`` (default) raises a ``ValueError`` naming it and both
            shapes; ``'skip'`` keeps it as initialised and logs it, for a deliberate partial
            load (e.g. ``in_channels=4`` from an RGB checkpoint).
        **kwargs: every argument of the parent. A ``Pretrained`` ``init_cfg`` of a stock Swin
            checkpoint carries q/k/v and the projection into the mixers (:mod:`.base`)."""


@register_model(scope='mmseg', name='NaLaSwinTransformer')
class SegNaLaSwinTransformer(SwinStages, MMSegSwinTransformer):
    __doc__ = "mmseg's ``SwinTransformer`` with a token mixer per stage.\n" + SWIN_ARGS_DOC
