"""Carrying a stock backbone's attention weights into the token mixers that replace it.

A pure function over state dicts, beside the backbones that use it (:mod:`.common`): the upstream
attention's fused q, k, v projection goes into the first ``3C`` rows of the mixer's ``qkvg``
(the same q | k | v row order), its output projection into ``out_proj``; what has no counterpart
in a global mixer (Swin's relative-position table and index, MiT's/PVTv2's spatial-reduction
``sr`` conv and its ``norm``) is dropped; the mixer's own parts (the gate rows ``qkvg[3C:]``,
LePE, its LayerNorm ``ln``) stay as the mixer initialised them. Every tensor is accounted for in
a :class:`CarryOverReport`.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Tuple

import torch
from torch import Tensor

# the module name under which an adapter holds its mixer (``<attention>.mixer.qkvg.weight``)
MIXER_ATTR = 'mixer'


@dataclass(frozen=True)
class AttentionLayout:
    """Names, relative to the upstream attention module, of the tensors that carry over."""
    name: str
    qkv_weight: str
    qkv_bias: str
    proj_weight: str
    proj_bias: str


# mmseg's / mmdet's ShiftWindowMSA (``attn``) -> WindowMSA (``w_msa``) with ``qkv`` and ``proj``
SWIN_WINDOW_ATTENTION = AttentionLayout('ShiftWindowMSA', 'w_msa.qkv.weight', 'w_msa.qkv.bias',
                                        'w_msa.proj.weight', 'w_msa.proj.bias')
# mmseg's EfficientMultiheadAttention and mmdet's SpatialReductionAttention: mmcv's
# MultiheadAttention around torch's nn.MultiheadAttention (``attn``), q | k | v in ``in_proj``
SPATIAL_REDUCTION_ATTENTION = AttentionLayout('spatial-reduction MultiheadAttention',
                                              'attn.in_proj_weight', 'attn.in_proj_bias',
                                              'attn.out_proj.weight', 'attn.out_proj.bias')


@dataclass
class CarryOverReport:
    """What happened to each swapped attention module, keyed by its name in the backbone."""
    carried: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)  # (source, target)
    dropped: Dict[str, List[str]] = field(default_factory=dict)             # source keys
    new: Dict[str, List[str]] = field(default_factory=dict)                 # target keys / rows
    already_swapped: List[str] = field(default_factory=list)  # the checkpoint had the mixer

    def lines(self, stage_of: Mapping[str, int]) -> List[str]:
        """One line per stage (``stage_of``: attention module name -> stage index), naming the
        tensors relative to each block's attention module (the blocks of a stage agree)."""
        stages: Dict[int, List[str]] = {}
        for name in stage_of:
            stages.setdefault(stage_of[name], []).append(name)
        out = []
        for stage, names in sorted(stages.items()):
            def relative(entries, names=names):
                seen = {}
                for name in names:
                    for entry in entries(name):
                        seen[entry.replace(f'{name}.', '')] = None
                return list(seen)
            carried = relative(lambda n: [f'{s} -> {t}' for s, t in self.carried.get(n, [])])
            dropped = relative(lambda n: self.dropped.get(n, []))
            new = relative(lambda n: self.new.get(n, []))
            kept = [n for n in names if n in self.already_swapped]
            out.append(f'stage {stage + 1}, {len(names)} blocks, per block: carried {carried}; '
                       f'dropped {dropped}; new {new}'
                       + (f'; loaded as saved (a swapped checkpoint): {kept}' if kept else ''))
        return out


def carry_over(state_dict: Mapping[str, Tensor], model_state: Mapping[str, Tensor],
               swapped: Mapping[str, AttentionLayout]
               ) -> Tuple[Dict[str, Tensor], CarryOverReport]:
    """Map an upstream backbone state dict onto a backbone whose attention modules ``swapped``
    (name -> the upstream layout they replace) now hold a token mixer.

    Args:
        state_dict: the upstream backbone's tensors, keys relative to the backbone.
        model_state: the swapped backbone's current ``state_dict()``; the mixer's gate rows and
            new parts are taken from it.
        swapped: attention module name (``'stages.0.blocks.1.attn'``) -> upstream layout.

    Returns:
        A new state dict (other keys untouched) and the report. A checkpoint that already holds
        a block's mixer (one saved from a swapped model) passes through as saved.

    Raises:
        ValueError: an upstream q/k/v or projection whose shape does not fit the mixer.
    """
    state = dict(state_dict)
    report = CarryOverReport()
    for name, layout in swapped.items():
        source, target = f'{name}.', f'{name}.{MIXER_ATTR}.'
        under_source = sorted(k for k in state if k.startswith(source)
                              and not k.startswith(target))
        if f'{target}qkvg.weight' in state:
            report.already_swapped.append(name)
        carried, new = [], []
        qkvg_w = model_state[f'{target}qkvg.weight'].clone()
        qkvg_b = model_state[f'{target}qkvg.bias'].clone()
        width = qkvg_w.shape[1]
        if source + layout.qkv_weight in state:
            weight = state.pop(source + layout.qkv_weight)
            _check_shape(source + layout.qkv_weight, weight, (3 * width, width))
            qkvg_w[:3 * width] = weight
            carried.append((source + layout.qkv_weight, f'{target}qkvg.weight[:{3 * width}]'))
            if source + layout.qkv_bias in state:
                bias = state.pop(source + layout.qkv_bias)
                _check_shape(source + layout.qkv_bias, bias, (3 * width,))
                qkvg_b[:3 * width] = bias
                carried.append((source + layout.qkv_bias, f'{target}qkvg.bias[:{3 * width}]'))
            else:  # the upstream projection has no bias: the same function has zero bias rows
                qkvg_b[:3 * width] = 0
                carried.append(('(no q/k/v bias upstream: zeros)',
                                f'{target}qkvg.bias[:{3 * width}]'))
            state[f'{target}qkvg.weight'] = qkvg_w
            state[f'{target}qkvg.bias'] = qkvg_b
            new += [f'{target}qkvg.weight[{3 * width}:]', f'{target}qkvg.bias[{3 * width}:]']
        for src, dst in ((layout.proj_weight, 'out_proj.weight'),
                         (layout.proj_bias, 'out_proj.bias')):
            if source + src in state:
                value = state.pop(source + src)
                _check_shape(source + src, value, tuple(model_state[target + dst].shape))
                state[target + dst] = value
                carried.append((source + src, target + dst))
        if carried:
            mixer_keys = [k for k in model_state if k.startswith(target)]
            filled = {t.split('[')[0] for _, t in carried}
            new += sorted(k for k in mixer_keys if k not in filled and k not in state)
        report.carried[name] = carried
        report.dropped[name] = [k for k in under_source if k in state]
        for key in report.dropped[name]:
            del state[key]
        report.new[name] = new
    return state, report


def _check_shape(key: str, value: Tensor, expected: Tuple[int, ...]) -> None:
    if tuple(value.shape) != tuple(expected):
        raise ValueError(f'checkpoint tensor {key!r} has shape {tuple(value.shape)}; the mixer '
                         f'that replaces its attention expects {tuple(expected)} (are the '
                         f'embed_dims / num_heads of the config those of the checkpoint?)')


def resize_relative_position_tables(state: Dict[str, Tensor],
                                    model_state: Mapping[str, Tensor]) -> Dict[str, Tensor]:
    """Swin's softmax stages: bicubic-resize a pretrained relative-position table to the
    model's window, as the stock Swin's ``init_weights`` does (its number of heads must agree).
    """
    for key in [k for k in state if k.endswith('relative_position_bias_table')]:
        if key not in model_state:
            continue
        table, current = state[key], model_state[key]
        if table.shape[1] != current.shape[1]:
            raise ValueError(f'{key}: checkpoint has {table.shape[1]} heads, the model '
                             f'{current.shape[1]}')
        if table.shape[0] != current.shape[0]:
            side, new_side = round(table.shape[0] ** 0.5), round(current.shape[0] ** 0.5)
            grid = table.permute(1, 0).reshape(1, table.shape[1], side, side)
            grid = torch.nn.functional.interpolate(grid, size=(new_side, new_side),
                                                   mode='bicubic')
            state[key] = grid.reshape(current.shape[1], -1).permute(1, 0).contiguous()
    return state
