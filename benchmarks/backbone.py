"""Backbone benchmark: NaLaFormer-T (all linear, hybrid, all linear in the released op sequence)
vs mmseg's Swin-T, time and peak memory against the input size, inference and training step.

NaLa layers use the released kernel (``kernel='relu'``), as the fine-tuning configs do. The
released-style model is the all-linear one whose mixers run
:func:`nala_mm.ops.nala_released.nala_attention_released` (separate ReLU copies,
concatenations, four RoPE calls) instead of the fast op, through the registered
``ReleasedNaLaAttention``. Inference: eval mode, batch 1, ``torch.no_grad``. Training step:
train mode (BatchNorm statistics, DropPath), forward + backward of the sum of the four outputs,
batch 2. Measuring, processes and outputs: benchmarks/common.py.
Results: benchmarks/results/backbone.{json,md,png}.

    python benchmarks/backbone.py                          # fwd 1024 2048, train 512 1024
    python benchmarks/backbone.py --sizes 512 --train-sizes --models nala_t_linear swin_t
"""
import os.path as osp
import sys
from typing import Dict

import torch
from torch import nn

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import Step, sweep_cli  # noqa: E402
from nala_mm.models import GatedAttention  # noqa: E402
from nala_mm.ops.nala_released import nala_attention_released  # noqa: E402
from nala_mm.registry import register_model  # noqa: E402

BACKBONES: Dict[str, dict] = {
    'nala_t_linear': dict(label='NaLaFormer-T (all linear)'),
    'nala_t_hybrid': dict(label='NaLaFormer-T (hybrid)'),
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
        return NaLaFormer(arch='t', kernel='relu')
    if name == 'nala_t_linear':
        return NaLaFormer(arch='t', attn_types=('nala',) * 4, kernel='relu')
    return NaLaFormer(arch='t', attn_types=(dict(type='ReleasedNaLaAttention'),) * 4)


def backbone_step(name: str, side: int, mode: str, batch: int, device: str) -> Step:
    model = build_backbone(name).to(device)
    image = torch.randn(batch, 3, side, side, device=device)
    if mode == 'fwd':
        model.eval()  # not chained: mmseg's SwinTransformer.train() returns None

        def forward() -> None:
            with torch.no_grad():
                model(image)
        return forward

    model.train()

    def train_step() -> None:
        sum(out.sum() for out in model(image)).backward()
        model.zero_grad(set_to_none=True)
    return train_step


if __name__ == '__main__':
    sweep_cli(osp.abspath(__file__), __doc__, 'backbone', BACKBONES, backbone_step,
              reference='swin_t', default_sizes=dict(fwd=(1024, 2048), train=(512, 1024)),
              description='Backbone benchmark')
