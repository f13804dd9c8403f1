"""``torchrun`` without CUDA: the tools start the (gloo) process group themselves.

Why: mmengine 0.10.7's torchrun initialiser (``init_dist('pytorch')``) calls
``torch.cuda.set_device`` unconditionally, which a CPU-only torch rejects. The Runner calls it
only when no process group exists yet, so the project's tools create the group first
(:func:`init_cpu_process_group`, before the Runner is built). Nothing of mmengine changes;
mmseg's and mmdet's own ``train.py`` under ``torchrun`` still need CUDA.
"""
import datetime

import torch
import torch.distributed as torch_dist
from mmengine.config import Config


def init_cpu_process_group(cfg: Config) -> bool:
    """Initialise the process group of a ``--launcher pytorch`` run on a machine without CUDA
    from the config's ``env_cfg.dist_cfg``, as mmengine's launcher would; True if it did."""
    if cfg.get('launcher') != 'pytorch' or torch.cuda.is_available() or \
            torch_dist.is_initialized():
        return False
    dist_cfg = dict(cfg.get('env_cfg', {}).get('dist_cfg', {}))
    if dist_cfg.pop('init_backend', 'torch') != 'torch':
        return False  # deepspeed / colossalai initialisers are theirs to run
    if dist_cfg.get('timeout') is not None:  # seconds in the config, as mmengine reads it
        dist_cfg['timeout'] = datetime.timedelta(seconds=dist_cfg['timeout'])
    torch_dist.init_process_group(backend=dist_cfg.pop('backend', 'gloo'), **dist_cfg)
    return True
