"""Adapt the authors' classification checkpoints (spec §3) to the dense backbone, loudly.

mmengine's stock ``Pretrained`` init unwraps only ``state_dict``; fed the authors' DeiT-style
``{'model': ..., 'model_ema': ...}`` file it loads nothing and says nothing. Here the filter is a
pure function, and the loader refuses any file that would leave backbone tensors unloaded.
"""
import re
from typing import Dict, List, Mapping

from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader
from torch import Tensor, nn

# Classification tail of the authors' model; not part of a dense backbone.
TAIL_PREFIXES = ('proj.', 'norm.', 'head.')
# Deterministic buffers we rebuild at runtime from the input size.
REBUILT_KEY = re.compile(r'^layers\.\d+\.RoPE\.angle$')
# Wrappers that may prefix every key (DDP, a whole segmentor/detector checkpoint).
WRAPPER_PREFIXES = ('module.', 'backbone.')
# Ours, not the authors': missing from their files by design, kept at initialisation.
NEW_KEY = re.compile(r'^out_norm\d\.')


def _unwrap(checkpoint: Mapping, use_ema: bool) -> Mapping:
    if use_ema:
        if 'model_ema' not in checkpoint:
            raise KeyError(f"use_ema=True but the checkpoint has no 'model_ema' entry; it has "
                           f'{sorted(checkpoint)[:10]}')
        return checkpoint['model_ema']
    for key in ('model', 'state_dict'):
        if key in checkpoint:
            return checkpoint[key]
    if checkpoint and all(isinstance(v, Tensor) for v in checkpoint.values()):
        return checkpoint
    raise KeyError(f"the checkpoint holds neither 'model' nor 'state_dict' nor bare tensors; its "
                   f'top-level keys are {sorted(checkpoint)[:10]}')


def filter_authors_checkpoint(checkpoint: Mapping, use_ema: bool = False) -> Dict[str, Tensor]:
    """Authors' (or converted) checkpoint -> backbone ``state_dict`` with our key names."""
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f'a checkpoint must be a dict, got {type(checkpoint).__name__}')
    weights = _unwrap(checkpoint, use_ema)
    # A whole segmentor/detector checkpoint: its backbone is what a backbone can load.
    if any(key.startswith('backbone.') for key in weights):
        weights = {k: v for k, v in weights.items() if k.startswith('backbone.')}
    state = {}
    for key, value in weights.items():
        for prefix in WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
        if key.startswith(TAIL_PREFIXES) or REBUILT_KEY.match(key):
            continue
        state[key] = value
    return state


def _describe(keys: List[str], what: str, limit: int = 12) -> str:
    shown = ', '.join(keys[:limit]) + (f', ... ({len(keys) - limit} more)' if len(keys) > limit else '')
    return f'{len(keys)} {what}: {shown}'


def load_authors_checkpoint(model: nn.Module, path: str, use_ema: bool = False) -> Dict[str, int]:
    """Load ``path`` into ``model`` or raise listing every missing/unexpected/mis-shaped key."""
    checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    state = filter_authors_checkpoint(checkpoint, use_ema=use_ema)
    own = model.state_dict()
    missing = [k for k in own if k not in state and not NEW_KEY.match(k)]
    unexpected = [k for k in state if k not in own]
    mis_shaped = [f'{k} {tuple(state[k].shape)} vs model {tuple(own[k].shape)}'
                  for k in state if k in own and state[k].shape != own[k].shape]
    if missing or unexpected or mis_shaped:
        problems = [_describe(keys, what) for keys, what in (
            (missing, 'backbone keys missing from the checkpoint'),
            (unexpected, 'unexpected keys in the checkpoint'),
            (mis_shaped, 'mis-shaped tensors')) if keys]
        raise ValueError(f'checkpoint {path} does not fit this NaLaFormer (is it another variant? '
                         f'check `arch`):\n  ' + '\n  '.join(problems))
    model.load_state_dict(state, strict=False)
    kept = [k for k in own if k not in state]
    n_params = sum(v.numel() for v in state.values())
    print_log(f'NaLaFormer: loaded {len(state)} tensors ({n_params / 1e6:.2f}M values) from {path}'
              f'{" (EMA weights)" if use_ema else ""}; '
              f'{len(kept)} new keys keep their initialisation ({", ".join(kept) or "none"})',
              logger='current')
    return dict(loaded=len(state), kept=len(kept))
