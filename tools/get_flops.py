"""Parameters and FLOPs of a config's model (mmseg or mmdet), with NaLa and SDPA counted.

    python tools/get_flops.py configs/ade20k_nala_upernet.py --shape 512 512
    python tools/get_flops.py configs/coco_nala_mask-rcnn_1x.py --shape 800 1216 --backbone-only
    python tools/get_flops.py --variants            # backbone GFLOPs of XT..L at 224

One multiply-add counts as one flop (mmengine / fvcore); see :mod:`nala_mm.analysis.flops` for
what the kernelised-attention (NaLa, plain linear) and SDPA handles count. The input is a random
tensor of exactly ``--shape`` (batch 1; no data preprocessor, so no padding). A segmentor is
traced in ``mode='tensor'`` (backbone, neck and decode head; the auxiliary head, unused at
inference, is dropped as in mmseg's get_flops); a detector in ``mode='tensor'`` too (backbone,
neck, RPN proposals, heads, no post-processing). ``--variants`` writes the table of
benchmarks/results/tools/flops_variants.md (docs/user_guides/method.md, 'Block and backbone').
"""
import argparse
from functools import partial
from typing import Any, Tuple

import torch
from mmengine.analysis import parameter_count
from mmengine.config import DictAction
from torch import nn

from nala_mm.analysis import count_flops
from nala_mm.apis.config_loading import build_model_from_config
from nala_mm.apis.data_samples import data_samples
from nala_mm.models import ARCH_SETTINGS, NaLaFormer


def giga(flops: float) -> str:
    return f'{flops / 1e9:.3f}'


def model_and_inputs(config: str, height: int, width: int, backbone_only: bool,
                     cfg_options: dict) -> Tuple[nn.Module, Tuple[Any, ...], str]:
    """The module to trace, its inputs, and a description of what is counted."""
    model, scope = build_model_from_config(config, cfg_options)
    image = torch.randn(1, 3, height, width)
    if backbone_only:
        return model.backbone, (image,), 'backbone only'
    if scope == 'mmseg':
        model.auxiliary_head = None
        return model, (image,), 'segmentor: backbone + neck + decode head (mode=tensor)'
    # what mmdet's get_flops does: bind the data samples, trace forward(inputs) in tensor mode
    model.forward = partial(model.forward, data_samples=data_samples('mmdet', 1, height, width),
                            mode='tensor')
    return model, (image,), 'detector: backbone + neck + RPN + heads (mode=tensor)'


def report(config: str, height: int, width: int, backbone_only: bool, cfg_options: dict,
           max_depth: int) -> None:
    model, inputs, what = model_and_inputs(config, height, width, backbone_only, cfg_options)
    flops = count_flops(model, inputs, max_depth=max_depth)
    by_op = flops.by_operator
    print(flops.table)
    uncounted = ', '.join(f'{op} x{n}' for op, n in sorted(flops.uncounted.items()))
    line = '=' * 60
    print(f'{line}\nconfig: {config}\ncounted: {what}\ninput: (1, 3, {height}, {width})\n'
          f'params: {parameter_count(model)[""] / 1e6:.2f} M\n'
          f'GFLOPs: {giga(flops.total)}  (1 multiply-add = 1 flop)\n'
          f'  attention: {giga(flops.attention)}: kernelised (NaLa / linear) '
          f'{giga(by_op["attn_matmul"] + by_op["attn_elementwise"])} (matmul '
          f'{giga(by_op["attn_matmul"])}, element-wise {giga(by_op["attn_elementwise"])}), '
          f'softmax SDPA {giga(by_op["sdpa"])}\n'
          f'not counted (0 by convention): {uncounted or "-"}\n{line}')


class ClassificationTail(nn.Module):
    """The authors' ImageNet tail (docs/user_guides/method.md, 'Block and backbone'), counted only
    to compare
    with the paper's classifiers: proj, BN, Swish, average pool, 1x1 head. The per-token Linear
    is written as a 1x1 conv (same multiply-adds)."""

    def __init__(self, channels: int, hidden: int = 1024, classes: int = 1000):
        super().__init__()
        self.proj = nn.Conv2d(channels, hidden, 1)
        self.norm = nn.BatchNorm2d(hidden)
        self.act = nn.SiLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Conv2d(hidden, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.act(self.norm(self.proj(x)))))


def variants(side: int) -> None:
    """Backbone GFLOPs per variant (default hybrid attention), and with the classification tail
    (the paper's counts, docs/user_guides/method.md's variants table, are the classifiers')."""
    print(f'NaLaFormer backbones at {side} x {side} (default hybrid mixers), GFLOPs with '
          '1 multiply-add = 1 flop\n')
    print('| variant | backbone params w/o out norms (M) | + tail params (M) | '
          'backbone G | of which NaLa element-wise G | softmax SDPA G | out norms G | '
          'tail G | classifier-equivalent G | same without NaLa element-wise G |')
    print('|---' * 10 + '|')
    for arch in ARCH_SETTINGS:
        backbone = NaLaFormer(arch=arch)
        image = torch.randn(1, 3, side, side)
        flops = count_flops(backbone.eval(), (image,))
        total, by_op = flops.total, flops.by_operator
        # the dense-prediction out_norm{i} LayerNorms are not part of the classifier
        out_norms = sum(flops.by_module[f'out_norm{i}'] for i in backbone.out_indices)
        last = backbone.embed_dims[-1]
        tail = ClassificationTail(last).eval()
        tail_flops = count_flops(tail, (torch.randn(1, last, side // 32, side // 32),)).total
        params = parameter_count(backbone)[''] - sum(
            parameter_count(getattr(backbone, f'out_norm{i}'))[''] for i in backbone.out_indices)
        tail_params = parameter_count(tail)['']
        classifier = total - out_norms + tail_flops
        print(f'| {arch.upper()} | {params / 1e6:.2f} | {(params + tail_params) / 1e6:.2f} | '
              f'{giga(total)} | {giga(by_op["attn_elementwise"])} | '
              f'{giga(by_op["sdpa"])} | {giga(out_norms)} | {giga(tail_flops)} | '
              f'{giga(classifier)} | {giga(classifier - by_op["attn_elementwise"])} |')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', nargs='?', help='mm config (mmseg or mmdet)')
    parser.add_argument('--shape', type=int, nargs='+', default=None,
                        help='input H [W] (default 512 512; 224 with --variants)')
    parser.add_argument('--backbone-only', action='store_true', help='count the backbone alone')
    parser.add_argument('--variants', action='store_true',
                        help='backbone GFLOPs of NaLaFormer XT/T/S/B/L at 224')
    parser.add_argument('--max-depth', type=int, default=3, help='depth of the module table')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='override config settings, key=value')
    args = parser.parse_args()
    shape = args.shape or ([224] if args.variants else [512])
    if len(shape) not in (1, 2):
        parser.error('--shape takes H or H W')
    height, width = shape[0], shape[-1]
    if args.variants:
        variants(height)
        return
    if args.config is None:
        parser.error('a config is needed (or --variants)')
    report(args.config, height, width, args.backbone_only, args.cfg_options, args.max_depth)


if __name__ == '__main__':
    main()
