"""Mixed precision for the tools: ``--amp`` and a bf16 optimizer wrapper that runs on CPU."""
from contextlib import contextmanager

import torch
from mmengine.config import Config
from mmengine.optim import OptimWrapper
from torch import nn

from ...registry import register_optim_wrapper


@register_optim_wrapper
class BF16AutocastOptimWrapper(OptimWrapper):
    """bf16 autocast around the forward, no loss scaling (bf16 has fp32's exponent range).

    mmengine's ``AmpOptimWrapper`` refuses to run without a GPU; this is the CPU counterpart
    (it works on GPU too). NaLa's attention math stays float32 inside it.
    """

    @contextmanager
    def optim_context(self, model: nn.Module):
        with super().optim_context(model):
            device = next(model.parameters()).device.type
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                yield


def enable_amp(cfg: Config) -> None:
    """Switch ``cfg.optim_wrapper`` to mixed precision: fp16 + dynamic loss scaling on GPU
    (mmengine's ``AmpOptimWrapper``), bf16 autocast on CPU."""
    wrapper = cfg.optim_wrapper
    if wrapper.get('type', 'OptimWrapper') not in ('OptimWrapper', 'AmpOptimWrapper',
                                                     'BF16AutocastOptimWrapper'):
        raise ValueError(f'--amp cannot wrap optim_wrapper type {wrapper.type!r}; expected '
                         "'OptimWrapper'")
    if torch.cuda.is_available():
        wrapper.type = 'AmpOptimWrapper'
        wrapper.loss_scale = 'dynamic'
    else:
        wrapper.type = 'BF16AutocastOptimWrapper'
