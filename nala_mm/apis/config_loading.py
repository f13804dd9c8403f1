"""Reading a config as the upstream tools do, adapted to the machine, and building its model.

mmdet is optional (``pip install nala-mm[det]``): where it does not import, a detection config
stops here, saying so, before mmengine fails on it with less to go on (``mmdet::`` bases,
``init_default_scope('mmdet')``).
"""
import ast
import os.path as osp
from typing import List, Optional, Set, Tuple

import torch
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.utils import get_installed_path
from torch import nn

from ..registry import host_imports, models_registry


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


def require_mmdet(config: str, why: str) -> None:
    """Raise where mmdet does not import: ``config`` needs it, for the reason ``why``."""
    if not host_imports('mmdet'):
        raise ModuleNotFoundError(
            f'{config} is a detection config ({why}) and mmdet does not import here: install '
            "nala-mm's detection extra, pip install nala-mm[det]", name='mmdet')


def _bases(path: str) -> List[str]:
    """The ``_base_`` entries config file ``path`` assigns literally; none for a file that is
    not a readable Python config (mmengine reports it)."""
    if not path.endswith('.py'):
        return []
    try:
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    bases: List[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == '_base_'
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            bases = [value] if isinstance(value, str) else \
                list(value) if isinstance(value, (list, tuple)) else []
    return [b for b in bases if isinstance(b, str)]


def base_packages(path: str) -> Set[str]:
    """The packages of the ``pkg::`` bases config file ``path`` inherits, directly or through
    its local bases, read from the files before mmengine resolves them."""
    packages: Set[str] = set()
    pending, seen = [osp.abspath(path)], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for base in _bases(current):
            if '::' in base:
                packages.add(base.split('::', 1)[0])
            else:
                pending.append(osp.abspath(osp.join(osp.dirname(current), base)))
    return packages


def load_config(path: str, launcher: str = 'none', cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None) -> Config:
    """Read a config the way the upstream tools do, then adapt it to a machine without CUDA.

    Without CUDA, torch's SyncBatchNorm cannot run and NCCL does not exist, so multi-process
    runs use BN per process, the gloo backend and DDP without device ids (mmengine already
    reverts SyncBN to BN for a single process). A detection config where mmdet does not import
    stops first, saying how to install it (:func:`require_mmdet`).
    """
    if 'mmdet' in base_packages(path):
        require_mmdet(path, 'it inherits mmdet:: bases')
    cfg = Config.fromfile(path)
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('default_scope') == 'mmdet':
        require_mmdet(path, "default_scope='mmdet'")
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


def enable_auto_scale_lr(cfg: Config) -> None:
    """``--auto-scale-lr`` (as mmdet's train.py): turn on mmengine's learning-rate scaling, by
    which the Runner multiplies the learning rate by the run's total batch (processes x
    ``train_dataloader.batch_size``) over ``auto_scale_lr.base_batch_size``, the batch the
    recipe's rate was set for. The config must say that batch."""
    scaling = cfg.get('auto_scale_lr')
    if not isinstance(scaling, dict) or isinstance(scaling.get('base_batch_size'), bool) or \
            not isinstance(scaling.get('base_batch_size'), int) or scaling['base_batch_size'] < 1:
        raise ValueError('--auto-scale-lr needs auto_scale_lr = dict(enable=False, '
                         'base_batch_size=N) in the config, N the total batch its learning rate '
                         f'was set for (a positive integer); got auto_scale_lr={scaling!r}')
    cfg.auto_scale_lr.enable = True


def resolve_config_path(path: str) -> str:
    """``'mmseg::swin/x.py'`` -> the file inside the installed package; other paths unchanged."""
    if '::' not in path:
        return path
    package, relative = path.split('::', 1)
    if package == 'mmdet':
        require_mmdet(path, "one of mmdet's configs")
    return osp.join(get_installed_path(package), '.mim', 'configs', relative)


def build_model(cfg: Config) -> nn.Module:
    """``cfg.model`` built by the registry of the config's default scope (``'mmseg'`` when it
    names none), made the default scope first; SyncBN layers run as BN (one process)."""
    scope = cfg.get('default_scope', 'mmseg')
    if scope == 'mmdet':
        require_mmdet(cfg.filename or 'the config', "default_scope='mmdet'")
    init_default_scope(scope)
    return revert_sync_batchnorm(models_registry(scope).build(cfg.model))


def build_model_from_config(path: str, cfg_options: Optional[dict] = None) -> Tuple[nn.Module, str]:
    """Build a config's model (:func:`build_model`) in eval mode.

    Returns the model and the config's default scope (``'mmseg'`` or ``'mmdet'``). Weights are
    not initialised from any checkpoint (nothing is downloaded).
    """
    cfg = load_config(resolve_config_path(path), cfg_options=cfg_options)
    return build_model(cfg).eval(), cfg.get('default_scope', 'mmseg')
