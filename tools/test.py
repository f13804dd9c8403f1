"""Evaluate a checkpoint of any mmseg or mmdet config with mmengine's Runner.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out PATH] [--show-dir DIR] [--tta]
                         [--compile]

``--compile``: the model's feature extraction (backbone and neck) runs through ``torch.compile``
with dynamic sizes (:mod:`nala_mm.apis.compile`); mmengine itself leaves testing eager.
"""
import argparse
import os

import numpy as np
from mmengine.config import Config, DictAction

from nala_mm import compat
from nala_mm.apis.compile import compile_feature_extraction
from nala_mm.apis.config_loading import load_config
from nala_mm.datasets.checks import explained_data_errors

# the host changes this tool relies on (Runner checkpoints under weights-only loading, the atomic
# checkpoint backend): see nala_mm/compat/
compat.install()


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
    parser.add_argument('--compile', action='store_true',
                        help='torch.compile the feature extraction (backbone and neck)')
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


def _predicts_masks(node) -> bool:
    """Whether a model config has a (non-None) mask head anywhere (Mask R-CNN, Cascade, ...)."""
    if isinstance(node, dict):
        return node.get('mask_head') is not None or any(_predicts_masks(v) for v in node.values())
    if isinstance(node, (list, tuple)):
        return any(_predicts_masks(v) for v in node)
    return False


def check_tta(cfg: Config, path: str, detection: bool) -> None:
    """Refuse --tta with a message instead of an AttributeError deep in the Runner."""
    missing = [key for key in ('tta_model', 'tta_pipeline') if cfg.get(key) is None]
    if missing:
        raise SystemExit(
            f'--tta: config {path} defines no {" and no ".join(missing)}; test-time '
            'augmentation needs both (a tta_model wrapping the model, e.g. '
            "dict(type='DetTTAModel', tta_cfg=...) or dict(type='SegTTAModel'), and a "
            "tta_pipeline with a TestTimeAug step). The detection configs inherit them from "
            'configs/_base_/nala_det_tta.py; add it to the _base_ list, or test without --tta.')
    if detection and cfg.tta_model.get('type') == 'DetTTAModel' and _predicts_masks(cfg.model):
        # mmdet 3.3's DetTTAModel asserts that no view predicts masks
        raise SystemExit(
            f'--tta: config {path} predicts instance masks, and mmdet\'s DetTTAModel merges '
            'boxes only (it refuses masks). Evaluate boxes with TTA by dropping the mask branch: '
            '--cfg-options model.roi_head.mask_head=None test_evaluator.metric=bbox, '
            'or test masks without --tta.')


def build_config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config, args.launcher, args.cfg_options, args.work_dir)
    cfg.load_from = args.checkpoint
    detection = cfg.get('default_scope') == 'mmdet'
    if args.show or args.show_dir:
        _enable_visualization(cfg, args, detection)
    if args.tta:
        check_tta(cfg, args.config, detection)
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
    runner = compat.build_runner(cfg, ['test_dataloader'])
    if args.compile:
        compile_feature_extraction(runner.model)
    if args.out and cfg.get('default_scope') == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    with explained_data_errors(cfg, ['test_dataloader']):
        metrics = runner.test()
    # mmseg's metrics are numpy float32 (54.56 would print as 54.560001373291016)
    print('metrics: ' + ', '.join(f'{k}={float(v):.4f}' if isinstance(v, (float, np.floating))
                                  else f'{k}={v}' for k, v in metrics.items()))


if __name__ == '__main__':
    main()
