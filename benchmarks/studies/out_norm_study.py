"""Why the detection demo sets ``out_norm_cfg=None``: Mask R-CNN from scratch with and without the
per-output LayerNorms, beside a ResNet-18, on the embedded COCO-format data.

The detection demo's config (configs/demo/coco_demo_nala_mask-rcnn.py), shortened to
``--epochs`` (10 by default); only the backbone differs between variants:

* ``nala``: the demo's NaLaFormer as configured (``out_norm_cfg=None``: raw stage features);
* ``nala-out-norm``: the same with a LayerNorm on each returned map (the library default
  ``out_norm_cfg=dict(type='LN', eps=1e-6)``, as Swin-style backbones do);
* ``resnet18``: mmdet's ResNet-18 from scratch, a convolutional reference for the same heads.

Each variant trains in its own process through tools/train.py and is evaluated once at the end
(bbox and segm mAP on the 30 validation images). Results:
benchmarks/results/studies/out_norm_study.{json,md} (``python -m benchmarks run out_norm_study``).

    python -m benchmarks.studies.out_norm_study
    python -m benchmarks.studies.out_norm_study --epochs 4 --variants nala nala-out-norm
"""
import argparse
import json
import os
import os.path as osp
import tempfile
from typing import Dict

from ..lib import report
from ..lib.paths import REPO, STUDY_RESULTS
from ..lib.runs import train_config

DEMO = osp.join(REPO, 'configs', 'demo', 'coco_demo_nala_mask-rcnn.py')
VARIANTS: Dict[str, dict] = {
    'nala': dict(label='NaLaFormer, out_norm=False (the demo)',
                 model="dict(backbone=dict(out_norm_cfg=None))"),
    'nala-out-norm': dict(label='NaLaFormer, out_norm=True (library default)',
                          # _delete_: the demo's None cannot take a dict by merging
                          model="dict(backbone=dict(out_norm_cfg=dict(_delete_=True, "
                                "type='LN', eps=1e-6)))"),
    'resnet18': dict(
        label='ResNet-18',
        model=("dict(backbone=dict(_delete_=True, type='mmdet.ResNet', depth=18, num_stages=4, "
               "out_indices=(0, 1, 2, 3), frozen_stages=-1, norm_eval=False, style='pytorch', "
               "norm_cfg=dict(type='BN', requires_grad=True), init_cfg=None), "
               "neck=dict(in_channels=[64, 128, 256, 512]))")),
}
CONFIG = """_base_ = [{demo!r}]
model = {model}
randomness = dict(seed={seed})
max_epochs = {epochs}
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=max_epochs, max_keep_ckpts=1))
"""
METRICS = ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50')


def run_one(variant: str, epochs: int, seed: int, work_root: str) -> dict:
    run = train_config(CONFIG.format(demo=DEMO, model=VARIANTS[variant]['model'], seed=seed,
                                     epochs=epochs), variant, work_root)
    if 'error' in run:
        return dict(variant=variant, error=run['error'])
    records = run['records']
    val = [r for r in records if 'coco/bbox_mAP' in r][-1]
    losses = [r for r in records if 'loss_cls' in r]
    return dict(variant=variant, label=VARIANTS[variant]['label'], epochs=epochs, seed=seed,
                **{m.split('/')[1]: val[m] for m in METRICS},
                final_loss_cls=losses[-1]['loss_cls'], final_acc=losses[-1].get('acc'),
                final_loss_mask=losses[-1]['loss_mask'], wall_seconds=run['wall_seconds'])


def write_outputs(saved: dict, stem: str) -> None:
    """``stem.json`` (``saved``) and its page ``stem.md``."""
    report.write_json(stem + '.json', saved)
    runs = saved['runs']
    lines = ['# Mask R-CNN from scratch: per-output LayerNorm or not (embedded demo data)', '',
             f"The detection demo config, {saved['epochs']} epochs, seed {saved['seed']}; only the "
             f'backbone differs. mAP on the 30 validation images; the RoI classifier\'s last '
             f'logged loss and accuracy (a stall sits at the class prior: accuracy = background '
             f'share).', '']
    lines += report.markdown_table(
        ['backbone', 'bbox mAP', 'bbox AP50', 'segm mAP', 'segm AP50', 'loss_cls', 'acc',
         'loss_mask'],
        [[r['variant'], f"error: {r['error']}"] + [''] * 6 if 'error' in r else
         [r['label'], f"{r['bbox_mAP']:.3f}", f"{r['bbox_mAP_50']:.3f}", f"{r['segm_mAP']:.3f}",
          f"{r['segm_mAP_50']:.3f}", f"{r['final_loss_cls']:.3f}", f"{r['final_acc']:.1f}",
          f"{r['final_loss_mask']:.3f}"] for r in runs])
    report.write_markdown(stem + '.md', lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--variants', nargs='+', choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out', default=STUDY_RESULTS)
    report.add_report_only_argument(parser, 'out_norm_study')
    args = parser.parse_args()
    stem = osp.join(args.out, 'out_norm_study')
    if args.report_only:
        write_outputs(report.read_json(stem + '.json'), stem)
        return
    os.chdir(REPO)  # the demo config's data root is relative to the repository
    from mmengine.config import Config

    from nala_mm.datasets.synthetic_coco import generate_coco_like
    generate_coco_like(Config.fromfile(DEMO).train_dataloader.dataset.data_root)
    from tqdm import tqdm
    os.makedirs(args.out, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix='nala_out_norm_') as work_root:
        for variant in (progress := tqdm(args.variants, desc='out_norm study')):
            progress.set_postfix_str(variant)
            runs.append(run_one(variant, args.epochs, args.seed, work_root))
            progress.write(json.dumps(runs[-1]))
            # an interrupted study keeps what it finished
            write_outputs(dict(config=osp.relpath(DEMO, REPO), epochs=args.epochs, seed=args.seed,
                               data='embedded synthetic COCO-format data (make demo-det)',
                               runs=runs), stem)
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
