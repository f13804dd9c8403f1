"""The one switch every op of the package takes: ``mode='fast' | 'reference'``.

``'reference'`` is an op's plain formula in tensor ops, differentiated by autograd: the readable
ground truth. ``'fast'`` is the same numbers through a hand-written autograd node (less memory
kept for the backward, faster kernels on CPU). Ops call :func:`resolve_mode` on entry; it is the
one place where exporting forces the reference path: the fast nodes are
``torch.autograd.Function``\\ s, some rotate with complex numbers and cache tables by size, and
ONNX has no form for any of that, while an exporter's sizes are symbolic.

Compiled (``torch.compile``), ``'fast'`` means the reference formula handed to inductor, which
fuses its element-wise chains itself (Triton on CUDA, C++/OpenMP on CPU): the hand-written nodes
write into views with ``out=`` and key Python caches by size, which dynamo cannot trace without
breaking the graph. An op whose fast path is already plain PyTorch (SDPA in
:func:`nala_mm.models.window_attention.softmax_attention`) passes ``traceable=True`` and keeps
it. Per op, once compiled:

* ``kernelized_attention`` / ``nala_attention``: the naive formula (:mod:`.attention.naive`);
* ``rope_table_for``: the table built in the graph (no size-keyed cache);
* RoPE in ``SoftmaxAttention``: the real-valued rotation (no complex numbers);
* ``gelu_conv``, ``conv2d`` (the depthwise weight gradient): their formulas;
* the window and global softmax of the ViTDet mixer: SDPA, as in eager.
"""
import torch

MODES = ('fast', 'reference')


def is_exporting() -> bool:
    """True while ``torch.onnx.export`` (either exporter) or ``torch.export`` traces a model."""
    return torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting()


def resolve_mode(mode: str, traceable: bool = False) -> str:
    """Validate ``mode`` and return the path to run: ``'reference'`` while exporting, and while
    compiling unless the op's fast path is ``traceable`` (plain PyTorch ops)."""
    if mode not in MODES:
        raise ValueError(f'unknown mode {mode!r}; expected one of {MODES}')
    if is_exporting() or (torch.compiler.is_compiling() and not traceable):
        return 'reference'
    return mode
