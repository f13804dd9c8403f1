"""ViTDet-B: windows vs global attention vs NaLa, time and peak memory of the backbone + SimpleFPN
at 1024² (4,096 tokens) and 2048² (16,384 tokens), its training step at 1024², and the whole
Mask R-CNN's inference at 1024².

Layouts (the ViT-B and the neck of configs/swap/coco_vitdet-b_mask-rcnn_lsj-100e.py):

* ``vitdet``: ViTDet's, 14x14 windows in eight blocks, global in 2, 5, 8, 11, all through fused
  SDPA (the reference of the ratios);
* ``nala``: NaLa in all twelve blocks (the ``_nala-all`` config);
* ``global_sdpa``: global softmax through fused SDPA in all twelve;
* ``vitdet_stock`` (1024² only): ViTDet's windows, its global blocks mmcv's stock
  ``MultiheadAttention`` (explicit N x N weights).

No relative-position biases in any layout (docs/user_guides/vitdet.md). Memory: each model in a
fresh process; time: a case's models in turns in one process (benchmarks/lib/grid.py). Batch 1.
Results: benchmarks/results/speed/vitdet.{json,md,png}.

    python -m benchmarks.speed.vitdet                 # everything
    python -m benchmarks.speed.vitdet --report-only
"""
import argparse
import os
from typing import List, Optional

import torch
from torch import nn

from nala_mm.analysis.measure import Step, device_name

from ..lib import report
from ..lib.grid import grid_cli, per_round_ratio, run_grid
from ..lib.paths import REPO
from ..lib.sweep import backbone_step

CONFIG = os.path.join(REPO, 'configs', 'swap', 'coco_vitdet-b_mask-rcnn_lsj-100e.py')
LAYOUTS = {
    'vitdet': (['window', 'window', 'sdpa'] * 4, "ViTDet's layout (windows + 4 global, SDPA)"),
    'nala': (['nala'] * 12, 'NaLa in every block'),
    'global_sdpa': (['sdpa'] * 12, 'global softmax (SDPA) in every block'),
    'vitdet_stock': (['window', 'window', 'softmax'] * 4,
                     "ViTDet's layout, global blocks stock MultiheadAttention"),
}
REFERENCE = 'vitdet'
SUBJECTS = {'backbone': 'ViT-B + SimpleFPN', 'mask-rcnn': 'Mask R-CNN (whole detector)'}


def cases(args) -> list:
    plain = ['vitdet', 'nala', 'global_sdpa']
    grid = [(dict(subject='backbone', mode='fwd', side=1024), plain + ['vitdet_stock']),
            (dict(subject='backbone', mode='fwd', side=2048), plain),
            (dict(subject='backbone', mode='train', side=1024), plain),
            (dict(subject='mask-rcnn', mode='fwd', side=1024), ['vitdet', 'nala'])]
    return [(settings, models) for settings, models in grid
            if settings['subject'] in args.subjects]


def detector_config(layout: str):
    from mmengine.config import Config
    cfg = Config.fromfile(CONFIG).model
    cfg.backbone.update(mixers=LAYOUTS[layout][0], init_cfg=None, drop_path_rate=0.0)
    return cfg


class BackboneWithNeck(nn.Module):
    """The detector's feature extractor: the ViT's stride-16 map through SimpleFPN."""

    def __init__(self, backbone: nn.Module, neck: nn.Module):
        super().__init__()
        self.backbone, self.neck = backbone, neck

    def forward(self, image):
        return self.neck(self.backbone(image))


def make_step(name: str, case: dict) -> Step:
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmengine.registry import init_default_scope

    import nala_mm  # noqa: F401  (registers the backbone and the neck)
    init_default_scope('mmdet')
    cfg = detector_config(name)
    side, device = case['side'], case['device']
    image = torch.randn(1, 3, side, side, device=device)
    if case['subject'] == 'backbone':
        model = BackboneWithNeck(MODELS.build(cfg.backbone), MODELS.build(cfg.neck)).to(device)
        model.backbone.init_weights()
        return backbone_step(model, image, case['mode'])
    detector = MODELS.build(cfg).to(device).eval()
    sample = DetDataSample(metainfo=dict(img_shape=(side, side), ori_shape=(side, side),
                                         pad_shape=(side, side), batch_input_shape=(side, side),
                                         scale_factor=(1.0, 1.0)))

    def predict() -> None:
        with torch.no_grad():
            detector.predict(image, [sample])
    return predict


def summarise(saved: dict) -> dict:
    rows = saved['rows']
    for row in rows:
        reference = next((r for r in rows if r['model'] == REFERENCE and all(
            r[k] == row[k] for k in ('subject', 'mode', 'side'))), None)
        row['ms_vs_vitdet'] = None if reference is None or reference is row else \
            per_round_ratio(row, reference)
        row['mib_vs_vitdet'] = None if reference is None or reference is row or \
            not row.get('mib') or not reference.get('mib') else row['mib'] / reference['mib']
    return saved


def write_outputs(saved: dict, stem: str) -> None:
    saved = summarise(saved)
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    report.write_json(stem + '.json', saved)
    lines = [f"# ViTDet-B layouts: windows, global softmax, NaLa ({saved['device']})", '',
             f"torch {saved['torch']}; batch 1; the ViT-B (patch 16, 12 blocks, 768 channels) "
             "and SimpleFPN of configs/swap/coco_vitdet-b_mask-rcnn_lsj-100e.py, no "
             "relative-position biases. Time: a case's models in turns in one process "
             f"({saved['repeats']} rounds after {saved['warmup']} warm-up), ratios the median "
             "of per-round ratios to ViTDet's layout. Memory: the peak of one call above the "
             'baseline, each model in its own process.', '']
    lines += report.markdown_table(
        ['subject', 'mode', 'side (tokens)', 'layout', 'median s', 'peak GiB',
         "time / ViTDet's", "memory / ViTDet's", 'note'],
        [[SUBJECTS[r['subject']], 'inference' if r['mode'] == 'fwd' else 'training step',
          f"{r['side']}² ({(r['side'] // 16) ** 2:,})", LAYOUTS[r['model']][1],
          report.fmt(r['ms'] / 1e3 if r.get('ms') else None, 2),
          report.fmt(r['mib'] / 1024 if r.get('mib') else None, 2),
          report.fmt(r.get('ms_vs_vitdet'), 3), report.fmt(r.get('mib_vs_vitdet'), 3),
          r.get('error') or r.get('skipped') or ''] for r in saved['rows']])
    report.write_markdown(stem + '.md', lines)
    plot(saved, stem + '.png')


def plot(saved: dict, path: str) -> None:
    plt = report.pyplot()
    groups = []
    for row in saved['rows']:
        key = (row['subject'], row['mode'], row['side'])
        if key not in groups:
            groups.append(key)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    width = 0.2
    for index, name in enumerate(LAYOUTS):
        for ax, key, scale in ((axes[0], 'ms', 1e3), (axes[1], 'mib', 1024)):
            values = [next((r[key] / scale for r in saved['rows'] if r['model'] == name
                            and (r['subject'], r['mode'], r['side']) == g and r.get(key)), 0)
                      for g in groups]
            ax.bar([i + index * width for i in range(len(groups))], values, width,
                   label=LAYOUTS[name][1])
    labels = [f"{'detector' if s == 'mask-rcnn' else 'backbone'} {m} {side}²"
              for s, m, side in groups]
    for ax, title in zip(axes, ('time (s)', 'peak memory (GiB)')):
        ax.set_xticks([i + 1.5 * width for i in range(len(groups))], labels, fontsize=8)
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    report.save_figure(fig, path)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--subjects', nargs='+', choices=list(SUBJECTS), default=list(SUBJECTS))
    parser.add_argument('--repeats', type=int, default=2, help='timed rounds in turns')
    parser.add_argument('--warmup', type=int, default=1, help='untimed rounds before timing')
    parser.add_argument('--timeout', type=int, default=3600, help='seconds per measurement')


def main() -> Optional[List[dict]]:
    parsed = grid_cli(__doc__, 'vitdet', make_step, write_outputs, arguments)
    if parsed is None:
        return None
    args, stem = parsed
    header = dict(device=device_name(args.device), torch=torch.__version__,
                  repeats=args.repeats, warmup=args.warmup, reference=REFERENCE,
                  layouts={k: v[1] for k, v in LAYOUTS.items()})
    rows = run_grid(__spec__.name, cases(args), repeats=args.repeats, warmup=args.warmup,
                    device=args.device, reference=REFERENCE, timeout=args.timeout,
                    after_case=lambda rows: write_outputs(dict(header, rows=rows), stem),
                    desc='vitdet')
    write_outputs(dict(header, rows=rows), stem)
    print(open(stem + '.md').read())
    return rows


if __name__ == '__main__':
    main()
