"""Export a segmentor, or any config's NaLaFormer backbone, to ONNX and check it in ONNX Runtime.

    python tools/export_onnx.py configs/ade20k_nala-t-linear_upernet.py --checkpoint CKPT \\
        --shape 512 512 --dynamic --out upernet.onnx
    python tools/export_onnx.py configs/coco_nala_mask-rcnn_1x.py --shape 800 1216 \\
        --backbone-only --out backbone.onnx

What is exported (batch 1 unless ``--batch``; float32; graph input ``input``):
  * a segmentor (UperNet, Semantic FPN, ...): the preprocessed image batch ``(B, 3, H, W)`` to
    ``seg_logits`` ``(B, num_classes, H, W)``, i.e. mmseg's ``EncoderDecoder.encode_decode``
    (backbone, neck, decode head, bilinear resize to the input size; no auxiliary head, no
    argmax, no normalisation: feed what the config's data preprocessor produces);
  * ``--backbone-only``: the NaLaFormer backbone of any config (mmseg or mmdet) to its stage
    features ``stage{i}`` for each ``i`` in ``out_indices``.
``--dynamic`` makes H and W symbolic. While an exporter traces, every token mixer computes with
plain tensor ops (:func:`nala_mm.ops.is_exporting`), and the decode heads' adaptive pooling
(UperNet) and scale-factor upsampling (Semantic FPN) are swapped for equivalents that follow the
runtime size (:func:`make_exportable`). ``--exporter torchscript`` uses torch's legacy
tracing exporter instead of ``torch.onnx.export(dynamo=True)``: same graph contract, exports in
seconds rather than minutes, deprecated by torch.

After export the file is run in ONNX Runtime (CPUExecutionProvider) on a random input and
compared with PyTorch at the export size and, with ``--dynamic``, at a second size that is not a
multiple of 32 (H + 13, W + 29). It prints the relative L2 error of every output and both
latencies, and exits with status 1 when the largest error exceeds ``--tolerance``.
Needs the deploy extra: ``pip install -e .[deploy]`` (onnx, onnxruntime, onnxscript).
"""
import argparse
import copy
import importlib
import os
import os.path as osp
import sys
import time
from statistics import median
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.config import DictAction
from torch import Tensor, nn

DEPLOY_PACKAGES = ('onnx', 'onnxruntime', 'onnxscript')
DEFAULT_TOLERANCE = 1e-4
# The dynamic check's second input: not a multiple of any stride, so every stage rounds.
SECOND_SIZE_OFFSET = (13, 29)
DEFAULT_OPSET = 18
# dynamo: torch.export-based, its operator library is opset 18 (an older target fails ONNX's
# version converter); torchscript: the legacy tracing exporter (deprecated in torch, ~15x faster
# to export here), SDPA needs opset 14.
MIN_OPSET = dict(dynamo=18, torchscript=14)


class SegmentorLogits(nn.Module):
    """Image batch -> logits at input resolution: mmseg's ``encode_decode`` as a plain module."""

    def __init__(self, segmentor: nn.Module):
        super().__init__()
        self.segmentor = segmentor

    def forward(self, images: Tensor) -> Tensor:
        # a torch.Size img_shape is what mmseg's slide inference passes: resize to exactly it
        metas = [dict(img_shape=images.shape[2:]) for _ in range(images.shape[0])]
        return self.segmentor.encode_decode(images, metas)


class BackboneFeatures(nn.Module):
    """Image batch -> the backbone's stage features (a tuple, one per ``out_indices``)."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, images: Tensor) -> Tuple[Tensor, ...]:
        return tuple(self.backbone(images))


class ExportableAdaptiveAvgPool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d`` as two averaging matrices, for graphs with dynamic H and W.

    The ONNX translation of adaptive pooling (UperNet's pyramid pooling) bakes in the windows of
    the export size, so a dynamic graph would pool wrongly at any other size. Here bin ``i`` of
    ``o`` over ``n`` inputs averages ``[floor(i n / o), ceil((i + 1) n / o))``, as PyTorch does,
    with window bounds computed in the graph from the runtime size.
    """

    def __init__(self, output_size):
        super().__init__()
        self.output_size = (output_size, output_size) if isinstance(output_size, int) \
            else tuple(output_size)

    @staticmethod
    def _averaging(in_size, out_size: int, like: Tensor) -> Tensor:
        """``(out_size, in_size)`` matrix whose row i averages bin i."""
        bins = torch.arange(out_size, device=like.device)
        start = (bins * in_size) // out_size
        end = ((bins + 1) * in_size + out_size - 1) // out_size
        positions = torch.arange(in_size, device=like.device)
        inside = (positions >= start[:, None]) & (positions < end[:, None])
        return inside.to(like.dtype) / (end - start)[:, None].to(like.dtype)

    def forward(self, x: Tensor) -> Tensor:
        out_h, out_w = (size if size is not None else x.shape[axis]
                        for size, axis in zip(self.output_size, (-2, -1)))
        rows = self._averaging(x.shape[-2], out_h, x)
        cols = self._averaging(x.shape[-1], out_w, x)
        return rows @ x @ cols.transpose(0, 1)


class ExportableUpsample(nn.Module):
    """mmseg's ``Upsample`` by integral factors (Semantic FPN's head), exportable at any size.

    mmseg computes the output size as ``int(h * factor)``, a Python number that tracing bakes
    in, so the graph would resize every input to the export size's shape. Interpolating by the
    factor itself gives the same size and, for an integral factor, the same sampling positions.
    """

    def __init__(self, factors: Tuple[int, int], mode: str, align_corners: Optional[bool]):
        super().__init__()
        self.factors, self.mode, self.align_corners = factors, mode, align_corners

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, scale_factor=self.factors, mode=self.mode,
                             align_corners=self.align_corners)


def exportable_twin(module: nn.Module) -> Optional[nn.Module]:
    """The exportable equivalent of ``module``, or ``None`` when it exports as it is."""
    from mmseg.models.utils import Upsample
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return ExportableAdaptiveAvgPool2d(module.output_size)
    if isinstance(module, Upsample) and not module.size:
        factors = module.scale_factor if isinstance(module.scale_factor, tuple) \
            else (module.scale_factor,) * 2
        if all(float(f).is_integer() for f in factors):
            return ExportableUpsample(tuple(int(f) for f in factors), module.mode,
                                      module.align_corners)
    return None


def make_exportable(module: nn.Module) -> int:
    """Swap, in place, the modules whose traced form would bake in the export size (adaptive
    pooling, mmseg's scale-factor ``Upsample``) for their equivalents; the number swapped."""
    twins = []
    for name, child in module.named_modules():
        twin = exportable_twin(child)
        if twin is not None:
            twins.append((name, twin))
    for name, twin in twins:
        parent_name, _, attr = name.rpartition('.')
        setattr(module.get_submodule(parent_name), attr, twin)
    return len(twins)


def missing_deploy_packages() -> List[str]:
    """The deploy extra's packages that do not import."""
    missing = []
    for name in DEPLOY_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def build_exportable(config: str, checkpoint: Optional[str] = None, backbone_only: bool = False,
                     cfg_options: Optional[dict] = None) -> Tuple[nn.Module, List[str]]:
    """The module to export (eval mode) and its output names."""
    from mmengine.runner import load_checkpoint

    from nala_mm.analysis import build_model_from_config
    model, scope = build_model_from_config(config, cfg_options)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint, map_location='cpu')
    if backbone_only:
        backbone = model.backbone
        if not hasattr(backbone, 'out_indices'):
            raise ValueError(f'--backbone-only expects a NaLaFormer backbone with out_indices; '
                             f'{config} has {type(backbone).__name__}')
        return BackboneFeatures(backbone).eval(), [f'stage{i}' for i in backbone.out_indices]
    if scope != 'mmseg' or not hasattr(model, 'encode_decode'):
        raise ValueError(f'{config} builds a {type(model).__name__} (scope {scope!r}); whole-model '
                         f'export supports mmseg encoder-decoder segmentors, use --backbone-only '
                         f'for the backbone of a detector')
    return SegmentorLogits(model).eval(), ['seg_logits']


def export(module: nn.Module, example: Tensor, path: str, output_names: Sequence[str],
           dynamic: bool, opset: int = DEFAULT_OPSET, exporter: str = 'dynamo') -> None:
    """``torch.onnx.export`` of a copy of ``module`` made exportable (:func:`make_exportable`;
    ``module`` itself is unchanged); graph input ``input``, H and W symbolic when ``dynamic``."""
    exportable = copy.deepcopy(module)
    make_exportable(exportable)
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    names = dict(input_names=['input'], output_names=list(output_names), opset_version=opset)
    with torch.no_grad():
        if exporter == 'dynamo':
            dim = torch.export.Dim.DYNAMIC
            torch.onnx.export(exportable, (example,), path, dynamo=True, external_data=False,
                              dynamic_shapes=({2: dim, 3: dim},) if dynamic else None, **names)
        else:
            axes = {name: [2, 3] for name in ['input', *output_names]} if dynamic else None
            torch.onnx.export(exportable, (example,), path, dynamo=False, dynamic_axes=axes,
                              **names)


def ort_session(path: str):
    """An ONNX Runtime CPU session of ``path``."""
    import onnxruntime
    return onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])


def relative_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """``||actual - expected|| / ||expected||`` in float64."""
    expected = expected.astype(np.float64)
    return float(np.linalg.norm(actual.astype(np.float64) - expected)
                 / max(np.linalg.norm(expected), 1e-30))


def median_call_ms(step: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls after one warm-up call."""
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return median(times)


def compare(module: nn.Module, session, images: Tensor, output_names: Sequence[str],
            repeats: int) -> Dict[str, object]:
    """Relative L2 error of each ONNX Runtime output against PyTorch, and both latencies."""
    feed = {'input': images.numpy()}
    with torch.no_grad():
        expected = module(images)
    expected = (expected,) if isinstance(expected, Tensor) else expected
    actual = session.run(list(output_names), feed)
    errors = {}
    for name, a, e in zip(output_names, actual, expected):
        if a.shape != tuple(e.shape):
            raise RuntimeError(f'output {name}: ONNX Runtime shape {a.shape}, PyTorch '
                                 f'{tuple(e.shape)}')
        errors[name] = relative_l2(a, e.numpy())

    def torch_step():
        with torch.no_grad():
            module(images)

    return dict(shape=tuple(images.shape), errors=errors,
                torch_ms=median_call_ms(torch_step, repeats),
                ort_ms=median_call_ms(lambda: session.run(list(output_names), feed), repeats))


def check_sizes(height: int, width: int, dynamic: bool) -> List[Tuple[int, int]]:
    """The export size and, for a dynamic graph, one more that no stride divides."""
    sizes = [(height, width)]
    if dynamic:
        sizes.append((height + SECOND_SIZE_OFFSET[0], width + SECOND_SIZE_OFFSET[1]))
    return sizes


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
                        help='export the NaLaFormer backbone: outputs stage{i} per out_indices')
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
