"""Predict on an image or a folder and write colour overlays, via the upstream inferencers.

    python tools/infer.py CONFIG CHECKPOINT INPUT [--out-dir DIR] [--device cpu] [--compile]

Segmentation configs go through mmseg's ``MMSegInferencer``, detection configs through mmdet's
``DetInferencer``; overlays land in ``DIR/vis``, raw predictions in ``DIR/pred``.
``--compile`` runs the feature extraction through ``torch.compile`` (:mod:`nala_mm.apis.compile`).
"""
import argparse
import os.path as osp

from nala_mm import compat
from nala_mm.apis.compile import compile_feature_extraction
from nala_mm.apis.config_loading import load_config

# the host change this tool relies on (Runner checkpoints under weights-only loading): see
# nala_mm/compat/
compat.install()


def main() -> None:
    parser = argparse.ArgumentParser(description='Write prediction overlays')
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('input', help='an image file or a folder of images')
    parser.add_argument('--out-dir', default='work_dirs/infer')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--opacity', type=float, default=0.5, help='segmentation overlay opacity')
    parser.add_argument('--score-thr', type=float, default=0.3, help='detection score threshold')
    parser.add_argument('--compile', action='store_true',
                        help='torch.compile the feature extraction (backbone and neck)')
    args = parser.parse_args()
    if not osp.exists(args.input):
        raise FileNotFoundError(f'input {args.input} does not exist (expected an image or a '
                                f'folder of images)')
    cfg = load_config(args.config)
    if cfg.get('default_scope') == 'mmdet':
        from mmdet.apis import DetInferencer
        inferencer = DetInferencer(model=cfg, weights=args.checkpoint, device=args.device)
        if args.compile:
            compile_feature_extraction(inferencer.model)
        inferencer(args.input, out_dir=args.out_dir, pred_score_thr=args.score_thr,
                   no_save_pred=False)
    else:
        from mmseg.apis import MMSegInferencer
        inferencer = MMSegInferencer(model=cfg, weights=args.checkpoint, device=args.device)
        if args.compile:
            compile_feature_extraction(inferencer.model)
        inferencer(args.input, out_dir=args.out_dir, opacity=args.opacity,
                   img_out_dir='vis', pred_out_dir='pred')
    print(f'overlays written to {osp.join(args.out_dir, "vis")}')


if __name__ == '__main__':
    main()
