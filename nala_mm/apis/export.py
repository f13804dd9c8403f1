"""Export a segmentor, or any config's NaLaFormer backbone, to ONNX and check it in ONNX Runtime.

What is exported (:func:`build_exportable`; float32; graph input ``input``):

* a segmentor (UperNet, Semantic FPN, ...): the preprocessed image batch ``(B, 3, H, W)`` to
  ``seg_logits`` ``(B, num_classes, H, W)``, i.e. mmseg's ``EncoderDecoder.encode_decode``
  (backbone, neck, decode head, bilinear resize to the input size; no auxiliary head, no
  argmax, no normalisation: feed what the config's data preprocessor produces);
* ``backbone_only``: the NaLaFormer backbone of any config (mmseg or mmdet) to its stage
  features ``stage{i}`` for each ``i`` in ``out_indices``.

:func:`export` can make H and W symbolic (``dynamic``). While an exporter traces, every token
mixer computes with plain tensor ops (:func:`nala_mm.ops.resolve_mode`), and the decode heads'
adaptive pooling (UperNet) and scale-factor upsampling (Semantic FPN) are swapped, in a copy of
the model, for equivalents that follow the runtime size (:func:`make_exportable`). The
``'torchscript'`` exporter is torch's legacy tracing exporter: the same graph contract, much
quicker to export, deprecated by torch.

:func:`compare` runs the graph in ONNX Runtime (CPUExecutionProvider) against PyTorch: the
relative L2 error of every output and both latencies; :func:`check_sizes` gives the export size
and, for a dynamic graph, a second size that no stride divides. ``tools/export_onnx.py`` is the
command line; docs/user_guides/deploy.md has the measured errors and latencies. ONNX export needs
the deploy extra: ``pip install -e .[deploy]`` (onnx, onnxruntime, onnxscript).
"""
import copy
import importlib
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.measure import median_ms
from .config_loading import build_model_from_config

DEPLOY_PACKAGES = ('onnx', 'onnxruntime', 'onnxscript')
DEFAULT_TOLERANCE = 1e-4  # largest relative L2 error against PyTorch that a check accepts
# The dynamic check's second input: not a multiple of any stride, so every stage rounds.
SECOND_SIZE_OFFSET = (13, 29)
DEFAULT_OPSET = 18
EXPORTERS = ('dynamo', 'torchscript')
# dynamo: torch.export-based, its operator library is opset 18 (an older target fails ONNX's
# version converter); torchscript: the legacy tracing exporter, SDPA needs opset 14.
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
    def averaging_matrix(in_size, out_size: int, like: Tensor) -> Tensor:
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
        rows = self.averaging_matrix(x.shape[-2], out_h, x)
        cols = self.averaging_matrix(x.shape[-1], out_w, x)
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
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return ExportableAdaptiveAvgPool2d(module.output_size)
    try:
        from mmseg.models.utils import Upsample
    except ImportError:  # a detection-only install has no mmseg heads to swap
        return None
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
    """The module to export (eval mode) built from ``config`` (weights from ``checkpoint``) and
    its output names: ``['seg_logits']`` for a segmentor, ``stage{i}`` for a backbone."""
    from mmengine.runner import load_checkpoint
    model, scope = build_model_from_config(config, cfg_options)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint, map_location='cpu')
    if backbone_only:
        backbone = model.backbone
        if not hasattr(backbone, 'out_indices'):
            raise ValueError(f'--backbone-only expects a backbone with out_indices (NaLaFormer or '
                             f'a swapped stock backbone of nala_mm.models.swap); '
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
    if exporter not in EXPORTERS:
        raise ValueError(f'unknown exporter {exporter!r}; expected one of {EXPORTERS}')
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
    expected = np.asarray(expected, dtype=np.float64)
    return float(np.linalg.norm(np.asarray(actual, dtype=np.float64) - expected)
                 / max(np.linalg.norm(expected), 1e-30))


def compare(module: nn.Module, session, images: Tensor, output_names: Sequence[str],
            repeats: int) -> Dict[str, object]:
    """Relative L2 error of each ONNX Runtime output against PyTorch (``errors``, by output
    name), and the median latencies ``torch_ms`` and ``ort_ms`` of ``repeats`` calls after one
    warm-up call."""
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
                torch_ms=median_ms(torch_step, repeats),
                ort_ms=median_ms(lambda: session.run(list(output_names), feed), repeats))


def check_sizes(height: int, width: int, dynamic: bool) -> List[Tuple[int, int]]:
    """The export size and, for a dynamic graph, one more that no stride divides."""
    sizes = [(height, width)]
    if dynamic:
        sizes.append((height + SECOND_SIZE_OFFSET[0], width + SECOND_SIZE_OFFSET[1]))
    return sizes
