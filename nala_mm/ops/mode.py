"""The one switch every op of the package takes: ``mode='fast' | 'reference'``.

``'reference'`` is an op's plain formula in tensor ops, differentiated by autograd: the readable
ground truth. ``'fast'`` is the same numbers through hand-written nodes (less memory kept for the
backward, faster kernels on CPU): torch custom ops (``torch.library.custom_op``) whose backward
is a second custom op, so that ``torch.compile`` keeps them as nodes in eager and compiled runs
alike. Ops call :func:`resolve_mode` on entry; it is the one place where exporting forces the
reference path: ONNX has no form for the custom ops, and an exporter's sizes are symbolic.

Per op, compiled (``torch.compile``) with ``mode='fast'``:

* ``kernelized_attention`` / ``nala_attention``: the custom ops ``nala_mm::kernelized_state``
  and ``nala_mm::kernelized_readout`` (:mod:`.attention.custom_ops`);
* ``gelu_conv``, ``conv2d`` (the CPU weight gradient): ``nala_mm::gelu_conv``,
  ``nala_mm::conv2d``;
* ``rope_table_for``: the table built in the graph (its size-keyed cache is no graph op);
* RoPE in ``SoftmaxAttention``: the real-valued rotation (no complex numbers in the graph);
* the window and global softmax of the ViTDet mixer: SDPA, as in eager.

An op passes ``traceable=True`` when its fast path compiles as it is (the custom ops, SDPA).
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
