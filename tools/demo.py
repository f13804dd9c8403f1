"""The embedded demos: synthetic data in the real layouts -> train -> evaluate -> overlays.

    python tools/demo.py seg   # ADE20K layout, UperNet + NaLaFormer, mIoU  (make demo)
    python tools/demo.py det   # COCO layout, Mask R-CNN + NaLaFormer, AP   (make demo-det)

Data is generated once (deterministic) under data/demo; reruns reuse it.
"""
import argparse
import json
import os.path as osp
import time

from mmengine.config import DictAction
from mmengine.runner import Runner

from nala_mm.runtime import load_config

TASKS = {
    'seg': dict(config='configs/demo/ade20k_demo_nala_upernet.py', work_dir='work_dirs/demo_seg'),
    'det': dict(config='configs/demo/coco_demo_nala_mask-rcnn.py', work_dir='work_dirs/demo_det'),
}


def generate_data(task: str, data_root: str) -> dict:
    if task == 'seg':
        from nala_mm.datasets.synthetic_ade import generate_ade_like
        return generate_ade_like(data_root)
    from nala_mm.datasets.synthetic_coco import generate_coco_like
    return generate_coco_like(data_root)


def enable_test_overlays(runner: Runner) -> None:
    """Draw every test prediction (mmseg/mmdet's visualization hook, off during training)."""
    for hook in runner.hooks:
        if type(hook).__name__ in ('SegVisualizationHook', 'DetVisualizationHook'):
            hook.draw = True
            hook.interval = 1


def summarise(task: str, metrics: dict, data: dict, runner: Runner, seconds: float) -> dict:
    metrics = {k: float(v) for k, v in metrics.items()}  # numpy scalars -> JSON
    summary = dict(task=task, metrics=metrics, train_seconds=round(seconds, 1),
                   iterations=runner.iter, overlays=osp.join(runner.log_dir, 'vis_data'))
    if task == 'seg':
        from nala_mm.datasets.synthetic_ade import majority_baseline_miou
        summary['majority_class_baseline_mIoU'] = majority_baseline_miou(
            data['class_pixel_fraction'])
        print(f"\nmIoU {metrics['mIoU']:.2f} on the validation split "
              f"(majority-class baseline: {summary['majority_class_baseline_mIoU']:.2f}); "
              f"per-class IoU in the table above")
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
    parser.add_argument('task', choices=sorted(TASKS))
    parser.add_argument('--work-dir', help='defaults to work_dirs/demo_<task>')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override demo config settings, e.g. train_cfg.max_iters=100')
    args = parser.parse_args()
    spec = TASKS[args.task]
    cfg = load_config(spec['config'], cfg_options=args.cfg_options,
                      work_dir=args.work_dir or spec['work_dir'])
    data_root = cfg.train_dataloader.dataset.data_root
    data = generate_data(args.task, data_root)
    # evaluate once, after training, through the test loop (which also draws the overlays)
    cfg.train_cfg.val_interval = cfg.train_cfg.get('max_iters', cfg.train_cfg.get('max_epochs')) + 1
    runner = Runner.from_cfg(cfg)
    start = time.perf_counter()
    runner.train()
    seconds = time.perf_counter() - start
    enable_test_overlays(runner)
    metrics = runner.test()
    summarise(args.task, metrics, data, runner, seconds)


if __name__ == '__main__':
    main()
