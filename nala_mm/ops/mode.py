"""The one switch every op of the package takes: ``mode='fast' | 'reference'``.

``'reference'`` is an op's plain formula in tensor ops, differentiated by autograd: the readable
ground truth. ``'fast'`` is the same numbers through a hand-written autograd node (less memory
kept for the backward, faster kernels on CPU). Ops call :func:`resolve_mode` on entry; it is the
one place where exporting forces the reference path: the fast nodes are
``torch.autograd.Function``\\ s, some rotate with complex numbers and cache tables by size, and
ONNX has no form for any of that, while an exporter's sizes are symbolic.
"""
import torch

MODES = ('fast', 'reference')


def is_exporting() -> bool:
    """True while ``torch.onnx.export`` (either exporter) or ``torch.export`` traces a model."""
    return torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting()


def resolve_mode(mode: str) -> str:
    """Validate ``mode`` and return the path to run: ``'reference'`` while exporting."""
    if mode not in MODES:
        raise ValueError(f'unknown mode {mode!r}; expected one of {MODES}')
    return 'reference' if is_exporting() else mode
