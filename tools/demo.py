"""The embedded demos: synthetic data in the real layouts -> train -> evaluate -> overlays.

    python tools/demo.py seg   # ADE20K layout, UperNet + NaLaFormer, mIoU  (make demo)
    python tools/demo.py det   # COCO layout, Mask R-CNN + NaLaFormer, AP   (make demo-det)
    python tools/demo.py cls   # ImageNet layout, mmpretrain classifier, top-1 (make demo-cls)

Data is generated once (deterministic) under data/demo; reruns reuse it. Each run writes its
summary (metrics, the per-class table, time, iterations) to WORK_DIR/demo_summary.json
(``python -m benchmarks run demos`` commits both demos' summaries: benchmarks/studies/demos.py).
"""
import argparse
import json
import os.path as osp
import re
import time
from typing import Dict, List

from mmengine.config import DictAction
from mmengine.runner import Runner

from nala_mm import compat
from nala_mm.apis.config_loading import load_config
from nala_mm.datasets.demo import DEMO_TASKS

# the host changes this tool relies on (Runner checkpoints under weights-only loading, the atomic
# checkpoint backend): see nala_mm/compat/
compat.install()



def enable_test_overlays(runner: Runner) -> None:
    """Draw every test prediction (mmseg/mmdet's visualization hook, off during training)."""
    for hook in runner.hooks:
        if type(hook).__name__ in ('SegVisualizationHook', 'DetVisualizationHook'):
            hook.draw = True
            hook.interval = 1


def per_class_tables(log_text: str) -> List[Dict[str, Dict[str, float]]]:
    """The per-class tables the evaluators print (mmseg's IoU/Acc, mmdet's classwise AP), in
    order, as ``{class: {column: value}}``; the evaluators return only the summaries."""
    tables, header, rows = [], None, {}
    for line in log_text.splitlines():
        line = line.strip()
        if line.startswith('+'):  # a border: the table goes on
            continue
        cells = [c.strip() for c in line.strip('|').split('|')] if line.startswith('|') else None
        if not cells:
            if header and rows:
                tables.append(rows)
            header, rows = None, {}
            continue
        if header is None:
            header = cells
        elif len(cells) == len(header) and re.fullmatch(r'-?[\d.]+|nan', cells[1]):
            # nan (a class without instances) -> null: strict JSON
            rows[cells[0]] = {h: None if c == 'nan' else float(c)
                              for h, c in zip(header[1:], cells[1:])}
    if header and rows:
        tables.append(rows)
    return tables


def summarise(task: str, metrics: dict, data: dict, runner: Runner, seconds: float) -> dict:
    metrics = {k: float(v) for k, v in metrics.items()}  # numpy scalars -> JSON
    with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
        tables = per_class_tables(f.read())
    summary = dict(task=task, config=DEMO_TASKS[task].config, metrics=metrics,
                   train_seconds=round(seconds, 1), iterations=runner.iter,
                   overlays=osp.relpath(osp.join(runner.log_dir, 'vis_data')))
    if task == 'seg':  # the test pass prints one table: IoU and Acc per class
        summary['per_class'] = tables[-1] if tables else {}
    elif task == 'cls':  # mmpretrain's Accuracy prints no per-class table
        summary['chance_top1'] = data['chance_top1']
    else:  # classwise bbox then segm tables
        summary['per_class'] = dict(zip(('bbox', 'segm'), tables[-2:])) if len(tables) >= 2 \
            else {}
    if task == 'seg':
        from nala_mm.datasets.synthetic_ade import majority_baseline_miou
        summary['majority_class_baseline_mIoU'] = majority_baseline_miou(
            data['class_pixel_fraction'])
        print(f"\nmIoU {metrics['mIoU']:.2f} on the validation split "
              f"(majority-class baseline: {summary['majority_class_baseline_mIoU']:.2f}); "
              f"per-class IoU in the table above")
    elif task == 'cls':
        print(f"\ntop-1 {metrics['accuracy/top1']:.2f} % on the validation split (chance: "
              f"{summary['chance_top1']:.2f} %)")
    else:
        print(f"\nbbox mAP {metrics['coco/bbox_mAP']:.3f}, segm mAP {metrics['coco/segm_mAP']:.3f} "
              f'on the validation split')
    print(f"trained {runner.iter} iterations in {seconds / 60:.1f} min; overlays: "
          f"{summary['overlays']}")
    with open(osp.join(runner.work_dir, 'demo_summary.json'), 'w') as f:
        json.dump(summary, f, indent=2)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('task', choices=sorted(DEMO_TASKS))
    parser.add_argument('--work-dir', help='defaults to work_dirs/demo_<task>')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override demo config settings, e.g. train_cfg.max_iters=100')
    args = parser.parse_args()
    task = DEMO_TASKS[args.task]
    cfg = load_config(task.config, cfg_options=args.cfg_options,
                      work_dir=args.work_dir or task.work_dir)
    # where the config (with its overrides) reads the data; the default set
    data = task.generate(cfg.train_dataloader.dataset.data_root)
    # evaluate once, after training, through the test loop (which also draws the overlays)
    cfg.train_cfg.val_interval = cfg.train_cfg.get('max_iters', cfg.train_cfg.get('max_epochs')) + 1
    runner = compat.build_runner(cfg, ('train_dataloader', 'val_dataloader', 'test_dataloader'))
    start = time.perf_counter()
    runner.train()
    seconds = time.perf_counter() - start
    enable_test_overlays(runner)
    metrics = runner.test()
    summarise(args.task, metrics, data, runner, seconds)


if __name__ == '__main__':
    main()
