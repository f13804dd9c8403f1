"""Run-time glue for the tools: config loading adapted to the machine, and CPU-capable AMP."""
import os.path as osp
from contextlib import contextmanager
from typing import Optional

import torch
import torch.distributed as torch_dist
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from torch import nn


@OPTIM_WRAPPERS.register_module()
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


def _replace_sync_bn(node) -> int:
    """SyncBN -> BN in every nested ``norm_cfg``; returns how many were changed."""
    changed = 0
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
            changed += 1
        for value in node.values():
            changed += _replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            changed += _replace_sync_bn(value)
    return changed


def load_config(path: str, launcher: str = 'none', cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None) -> Config:
    """Read a config the way the upstream tools do, then adapt it to a machine without CUDA.

    Without CUDA, torch's SyncBatchNorm cannot run and NCCL does not exist, so multi-process
    runs use BN per process, the gloo backend and DDP without device ids (mmengine already
    reverts SyncBN to BN for a single process).
    """
    cfg = Config.fromfile(path)
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    if not torch.cuda.is_available():
        if cfg.get('env_cfg', {}).get('dist_cfg', {}).get('backend') == 'nccl':
            cfg.env_cfg.dist_cfg.backend = 'gloo'
        if launcher != 'none':
            if _replace_sync_bn(cfg.model):
                print_log('no CUDA: SyncBN layers run as per-process BN', logger='current')
            # DDP of a CPU module takes no device ids (mmengine passes the local rank)
            cfg.setdefault('model_wrapper_cfg',
                           dict(type='MMDistributedDataParallel', device_ids=None))
    return cfg


def cpu_aware_pytorch_launcher(original):
    """Wrap mmengine's torchrun initialiser, which calls ``torch.cuda.set_device``
    unconditionally (a CPU-only torch rejects it): without CUDA, initialise the (gloo) process
    group directly. Installed by :mod:`nala_mm.compat`."""

    def init_dist_pytorch(backend, init_backend='torch', **kwargs):
        if torch.cuda.is_available() or init_backend != 'torch':
            return original(backend, init_backend=init_backend, **kwargs)
        torch_dist.init_process_group(backend=backend, **kwargs)

    init_dist_pytorch.nala_cpu_aware = True
    return init_dist_pytorch
