"""Is the model being exported? Then every mixer takes plain tensor ops.

The fast kernelised mode is one ``autograd.Function`` that rotates with complex numbers and
caches RoPE tables by size; ONNX has no form for either, and an exporter's sizes are symbolic.
Every mixer therefore switches to its reference mode (the same numbers, see the parity tests)
while this is true.
"""
import torch


def is_exporting() -> bool:
    """True while ``torch.onnx.export`` (either exporter) or ``torch.export`` traces the model."""
    return torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting()
