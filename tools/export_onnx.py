"""Export a segmentor, or any config's NaLaFormer backbone, to ONNX and check it in ONNX Runtime.

    python tools/export_onnx.py configs/ade20k_nala-t-linear_upernet.py --checkpoint CKPT \\
        --shape 512 512 --dynamic --out upernet.onnx
    python tools/export_onnx.py configs/coco_nala_mask-rcnn_1x.py --shape 800 1216 \\
        --backbone-only --out backbone.onnx

What is exported, and how: :mod:`nala_mm.apis.export` (batch 1 unless ``--batch``; float32; graph
input ``input``; outputs ``seg_logits`` or, with ``--backbone-only``, ``stage{i}``).
``--dynamic`` makes H and W symbolic; ``--exporter torchscript`` uses torch's legacy tracing
exporter instead of ``torch.onnx.export(dynamo=True)``.

After export the file is run in ONNX Runtime (CPUExecutionProvider) on a random input and
compared with PyTorch at the export size and, with ``--dynamic``, at a second size that is not a
multiple of 32 (H + 13, W + 29). It prints the relative L2 error of every output and both
latencies, and exits with status 1 when the largest error exceeds ``--tolerance``.
Needs the deploy extra: ``pip install -e .[deploy]`` (onnx, onnxruntime, onnxscript).
See docs/user_guides/deploy.md.
"""
import argparse
import os.path as osp
import sys
import time

import torch
from mmengine.config import DictAction

from nala_mm import compat
from nala_mm.apis.export import (
    DEFAULT_OPSET,
    DEFAULT_TOLERANCE,
    DEPLOY_PACKAGES,
    MIN_OPSET,
    build_exportable,
    check_sizes,
    compare,
    export,
    missing_deploy_packages,
    ort_session,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config',
                        help='mm config (an mmseg segmentor; any config with --backbone-only)')
    parser.add_argument('--checkpoint', help='weights to load (mmengine load_checkpoint)')
    parser.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'),
                        help='input height and width of the export (and the first check)')
    parser.add_argument('--out', required=True, help='the .onnx file to write')
    parser.add_argument('--dynamic', action='store_true', help='symbolic H and W')
    parser.add_argument('--backbone-only', action='store_true',
                        help='export the backbone (NaLaFormer, or Swin/MiT/PVTv2 with NaLa swapped '
                             'in: configs/swap/): outputs stage{i} per out_indices')
    parser.add_argument('--batch', type=int, default=1, help='batch size B (static)')
    parser.add_argument('--exporter', choices=list(MIN_OPSET), default='dynamo',
                        help='torch.onnx.export(dynamo=True) (default) or the legacy TorchScript '
                             'exporter (faster to export, deprecated in torch)')
    parser.add_argument('--opset', type=int, default=DEFAULT_OPSET,
                        help=f'ONNX opset (dynamo >= {MIN_OPSET["dynamo"]}, torchscript >= '
                             f'{MIN_OPSET["torchscript"]})')
    parser.add_argument('--tolerance', type=float, default=DEFAULT_TOLERANCE,
                        help='largest relative L2 error accepted (exit status 1 above)')
    parser.add_argument('--repeats', type=int, default=3, help='timed calls per engine and size')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='override config settings, key=value')
    args = parser.parse_args(argv)
    if args.checkpoint is not None and not osp.isfile(args.checkpoint):
        parser.error(f'checkpoint file not found: {args.checkpoint}')
    if args.opset < MIN_OPSET[args.exporter]:
        parser.error(f'the {args.exporter} exporter needs --opset >= {MIN_OPSET[args.exporter]}, '
                     f'got {args.opset}')
    if min(args.shape) < 1 or args.batch < 1:
        parser.error(f'--shape and --batch must be positive, got shape={args.shape}, '
                     f'batch={args.batch}')
    missing = missing_deploy_packages()
    if missing:
        parser.exit(2, f'{parser.prog}: error: ONNX export needs {", ".join(missing)}: install '
                       f'the deploy extra with `pip install -e .[deploy]` '
                       f'(or `pip install {" ".join(DEPLOY_PACKAGES)}`)\n')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    compat.install()  # checkpoints saved by the project's runs load under weights-only unpickling
    module, output_names = build_exportable(args.config, args.checkpoint, args.backbone_only,
                                            args.cfg_options)
    height, width = args.shape
    generator = torch.Generator().manual_seed(0)
    example = torch.randn(args.batch, 3, height, width, generator=generator)
    start = time.perf_counter()
    export(module, example, args.out, output_names, args.dynamic, args.opset, args.exporter)
    print(f'exported {args.config} -> {args.out} ({osp.getsize(args.out) / 2 ** 20:.1f} MiB, '
          f'{args.exporter} exporter, opset {args.opset}, outputs {", ".join(output_names)}, '
          f'{"dynamic H, W" if args.dynamic else f"static {height}x{width}"}) '
          f'in {time.perf_counter() - start:.1f} s')

    session = ort_session(args.out)
    worst = 0.0
    for size in check_sizes(height, width, args.dynamic):
        images = torch.randn(args.batch, 3, *size, generator=generator)
        result = compare(module, session, images, output_names, args.repeats)
        errors = ', '.join(f'{name} {err:.2e}' for name, err in result['errors'].items())
        print(f'input {result["shape"]}: relative L2 error {errors}; PyTorch '
              f'{result["torch_ms"]:.1f} ms, ONNX Runtime {result["ort_ms"]:.1f} ms '
              f'({result["ort_ms"] / result["torch_ms"]:.2f}x PyTorch)')
        worst = max(worst, *result['errors'].values())
    verdict = 'OK' if worst <= args.tolerance else 'FAILED'
    print(f'largest relative L2 error {worst:.2e} (tolerance {args.tolerance:.0e}): {verdict}')
    return 0 if worst <= args.tolerance else 1


if __name__ == '__main__':
    sys.exit(main())
