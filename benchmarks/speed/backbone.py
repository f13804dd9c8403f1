"""Backbone benchmark: NaLaFormer-T (all linear, hybrid, all linear in the released op sequence)
vs mmseg's Swin-T, time and peak memory against the input size, inference and training step.

NaLa layers use the released kernel (``kernel='relu'``), as the fine-tuning configs do. The
released-style model is the all-linear one whose mixers run
:func:`tests.reference.released_op.nala_attention_released` (separate ReLU copies,
concatenations, RoPE per feature half) instead of the fast op: its NaLa mixers are swapped,
after building, for ``ReleasedNaLaAttention`` (registered nowhere). Inference: eval mode, batch 1,
``torch.no_grad``. Training step: train mode (BatchNorm statistics, DropPath), forward +
backward of the sum of the four outputs, batch 2. Processes, report and plot:
benchmarks/lib/sweep.py.
Results: benchmarks/results/speed/backbone.{json,md,png}; discussed in docs/reports/speed.md.

    python -m benchmarks.speed.backbone                          # fwd 1024 2048, train 512 1024
    python -m benchmarks.speed.backbone --sizes 512 --train-sizes --models nala_t_linear swin_t
"""
from typing import Dict

import torch
from torch import nn

from nala_mm.analysis.measure import Step
from nala_mm.models import GatedAttention, NaLaFormer, NormAwareLinearAttention
from tests.reference.released_op import nala_attention_released

from ..lib.sweep import backbone_step, sweep_cli

BACKBONES: Dict[str, dict] = {
    'nala_t_linear': dict(label='NaLaFormer-T (all linear)'),
    'nala_t_hybrid': dict(label='NaLaFormer-T (hybrid)'),
    'nala_t_linear_released': dict(label='NaLaFormer-T (all linear, released op sequence)'),
    'swin_t': dict(label='Swin-T'),
}


class ReleasedNaLaAttention(GatedAttention):
    """NaLa in the released op sequence (relu kernel): the shared wrapper with
    :func:`tests.reference.released_op.nala_attention_released` as its mixing."""

    def mix(self, q, k, v, rope):
        return nala_attention_released(q, k, v, rope=rope)


def with_released_mixers(backbone: nn.Module) -> nn.Module:
    """``backbone`` with every NaLa mixer replaced, in place, by a ``ReleasedNaLaAttention`` of
    the same sizes and parameters (the shared wrapper's names)."""
    nala = [(name, m) for name, m in backbone.named_modules()
            if isinstance(m, NormAwareLinearAttention)]
    for name, layer in nala:
        released = ReleasedNaLaAttention(layer.embed_dims, layer.num_heads,
                                         use_rope=layer.use_rope, rope_base=layer.rope_base)
        released.load_state_dict(layer.state_dict())
        parent, _, attr = name.rpartition('.')
        setattr(backbone.get_submodule(parent), attr, released)
    return backbone


def build_backbone(name: str, mode: str = 'fast') -> nn.Module:
    """A model of :data:`BACKBONES`; a NaLaFormer's ops take ``mode``."""
    if name == 'swin_t':
        from mmseg.models.backbones import SwinTransformer
        return SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
                               window_size=7, out_indices=(0, 1, 2, 3))
    nala = dict(type='NormAwareLinearAttention', kernel='relu')
    if name == 'nala_t_hybrid':
        return NaLaFormer(arch='t', mixers=(nala, nala, 'softmax', 'softmax'), mode=mode)
    all_linear = NaLaFormer(arch='t', mixers=(nala,) * 4, mode=mode)
    return all_linear if name == 'nala_t_linear' else with_released_mixers(all_linear)


def make_step(name: str, side: int, mode: str, batch: int, device: str) -> Step:
    model = build_backbone(name).to(device)
    return backbone_step(model, torch.randn(batch, 3, side, side, device=device), mode)


if __name__ == '__main__':
    sweep_cli(__spec__.name, __doc__, 'backbone', BACKBONES, make_step,
              reference='swin_t', default_sizes=dict(fwd=(1024, 2048), train=(512, 1024)),
              description='Backbone benchmark')
