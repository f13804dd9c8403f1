"""Evaluate a checkpoint of any mmseg or mmdet config with mmengine's Runner.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out PATH] [--show-dir DIR] [--tta]
"""
import argparse
import os

from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from nala_mm.runtime import load_config


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test (and evaluate) a segmentor or detector')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save the evaluation log')
    parser.add_argument('--out', help='segmentation: directory for the predicted label maps; '
                                      'detection: a .pkl file for the raw results')
    parser.add_argument('--show', action='store_true', help='show predictions in a window')
    parser.add_argument('--show-dir', help='directory to save prediction overlays to')
    parser.add_argument('--wait-time', type=float, default=2, help='seconds per shown image')
    parser.add_argument('--tta', action='store_true', help='test-time augmentation')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def _enable_visualization(cfg: Config, args: argparse.Namespace, detection: bool) -> None:
    hook = cfg.default_hooks.visualization
    hook.draw = True
    hook.interval = 1
    if args.show:
        hook.show = True
        hook.wait_time = args.wait_time
    if args.show_dir:
        if detection:
            hook.test_out_dir = args.show_dir
        else:
            cfg.visualizer.save_dir = args.show_dir


def build_config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config, args.launcher, args.cfg_options, args.work_dir)
    cfg.load_from = args.checkpoint
    detection = cfg.get('default_scope') == 'mmdet'
    if args.show or args.show_dir:
        _enable_visualization(cfg, args, detection)
    if args.tta:
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.tta_model.module = cfg.model
        cfg.model = cfg.tta_model
    if args.out and not detection:
        cfg.test_evaluator.output_dir = args.out
        cfg.test_evaluator.keep_results = True
    return cfg


def main() -> None:
    args = parse_args()
    cfg = build_config(args)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    if args.out and cfg.get('default_scope') == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    metrics = runner.test()
    print('metrics: ' + ', '.join(f'{k}={v:.4f}' if isinstance(v, float) else f'{k}={v}'
                                  for k, v in metrics.items()))


if __name__ == '__main__':
    main()
