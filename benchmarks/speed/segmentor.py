"""Segmentor benchmark: UperNet + NaLaFormer-T (all linear, hybrid) vs UperNet + Swin-T, built
from their configs: inference and training step against the input size.

Inference: eval mode, batch 1, ``torch.no_grad``, ``forward(mode='tensor')`` (backbone + decode
head, the logits at 1/4 scale). Training step: train mode, ``forward(mode='loss')`` on random
150-class label maps (decode and auxiliary heads), the summed loss's backward, batch 2.
Processes, report and plot: benchmarks/lib/sweep.py.
Results: benchmarks/results/speed/segmentor.{json,md,png} (``segmentor_cuda.*`` on GPU).
Discussed in docs/reports/speed.md.

    python -m benchmarks.speed.segmentor                              # fwd 1024 2048, train 512
    python -m benchmarks.speed.segmentor --sizes 512 --train-sizes --device cuda
"""
import os.path as osp
from typing import Dict

import torch

from nala_mm.analysis.measure import Step

from ..lib.paths import REPO
from ..lib.sweep import sweep_cli

SEGMENTORS: Dict[str, dict] = {
    'nala_t_linear': dict(label='UperNet + NaLaFormer-T (all linear)',
                          config=osp.join(REPO, 'configs', 'ade20k_nala-t-linear_upernet.py')),
    'nala_t_hybrid': dict(label='UperNet + NaLaFormer-T (hybrid)',
                          config=osp.join(REPO, 'configs', 'ade20k_nala_upernet.py')),
    'swin_t': dict(label='UperNet + Swin-T',
                   config='mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_'
                          'ade20k-512x512.py'),
}
NUM_CLASSES = 150


def segmentor_step(name: str, side: int, mode: str, batch: int, device: str) -> Step:
    from nala_mm.apis.config_loading import build_model_from_config
    from nala_mm.apis.data_samples import data_samples
    # no downloads or authors' files here: random initialisation (weights do not matter)
    model, _ = build_model_from_config(SEGMENTORS[name]['config'],
                                       {'model.backbone.init_cfg': None})
    model = model.to(device)
    images = torch.randn(batch, 3, side, side, device=device)
    if mode == 'fwd':
        model.eval()

        def forward() -> None:
            with torch.no_grad():
                model(images, mode='tensor')
        return forward

    samples = data_samples('mmseg', batch, side, side, NUM_CLASSES, device)
    model.train()

    def train_step() -> None:
        losses = model(images, samples, mode='loss')
        loss, _ = model.parse_losses(losses)
        loss.backward()
        model.zero_grad(set_to_none=True)
    return train_step


if __name__ == '__main__':
    sweep_cli(__spec__.name, __doc__, 'segmentor', SEGMENTORS, segmentor_step,
              reference='swin_t', default_sizes=dict(fwd=(1024, 2048), train=(512,)),
              description='Segmentor benchmark')
