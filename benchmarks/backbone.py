"""Backbone benchmark: NaLaFormer-T (hybrid, all-linear, all-linear in the released op sequence)
vs mmseg's Swin-T, time and peak memory against the input size.

Batch 1, eval mode (BatchNorm on running statistics, no DropPath) for both measurements, so the
forward is the same one: ``fwd`` under ``torch.no_grad``, and with ``--backward`` also
``fwd_bwd`` (forward, then backward of the sum of the four outputs; parameter gradients count
in its memory). At 1056 x 1056 the stride-4 stage holds 264^2 = ~70K tokens. The released-style
model is the all-linear one whose mixers run
:func:`nala_mm.ops.nala_released.nala_attention_released` (separate ReLU copies, concatenations,
four RoPE calls) instead of the fast path, through the registered ``ReleasedNaLaAttention``. Measuring, processes and outputs as in
benchmarks/segmentor.py. Results: benchmarks/results/backbone.{json,md,png}.

    python benchmarks/backbone.py                        # forward, 224 448 896 1056
    python benchmarks/backbone.py --backward             # and forward + backward
    python benchmarks/backbone.py --sizes 224 448 --models nala_t_linear swin_t
"""
import os.path as osp
from typing import Dict

import torch
from torch import nn

from nala_mm.models import GatedAttention
from nala_mm.ops.nala_released import nala_attention_released
from nala_mm.registry import register_model
from segmentor import Step, cli

LINEAR = ('nala', 'nala', 'nala', 'nala')
BACKBONES: Dict[str, dict] = {
    'nala_t_hybrid': dict(label='NaLaFormer-T (hybrid)'),
    'nala_t_linear': dict(label='NaLaFormer-T (all linear)'),
    'nala_t_linear_released': dict(label='NaLaFormer-T (all linear, released op sequence)'),
    'swin_t': dict(label='Swin-T'),
}


@register_model
class ReleasedNaLaAttention(GatedAttention):
    """NaLa in the released op sequence (relu kernel), as a registered mixer: the shared wrapper
    with :func:`nala_mm.ops.nala_released.nala_attention_released` as its mixing."""

    def mix(self, q, k, v, rope):
        return nala_attention_released(q, k, v, rope=rope)


def build_backbone(name: str) -> nn.Module:
    if name == 'swin_t':
        from mmseg.models.backbones import SwinTransformer
        return SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
                               window_size=7, out_indices=(0, 1, 2, 3))
    from nala_mm.models import NaLaFormer
    if name == 'nala_t_hybrid':
        return NaLaFormer(arch='t')
    if name == 'nala_t_linear':
        return NaLaFormer(arch='t', attn_types=LINEAR)
    return NaLaFormer(arch='t', attn_types=(dict(type='ReleasedNaLaAttention'),) * 4)


def backbone_step(name: str, side: int, mode: str, device: str) -> Step:
    model = build_backbone(name).to(device)
    model.eval()  # not chained: mmseg's SwinTransformer.train() returns None
    image = torch.randn(1, 3, side, side, device=device)

    def forward() -> None:
        with torch.no_grad():
            model(image)

    def forward_backward() -> None:
        sum(out.sum() for out in model(image)).backward()
        model.zero_grad(set_to_none=True)

    return forward if mode == 'fwd' else forward_backward


if __name__ == '__main__':
    cli(osp.abspath(__file__), __doc__, 'backbone', BACKBONES, backbone_step,
        default_sizes=(224, 448, 896, 1056), description='Backbone benchmark',
        backward_flag=True)
