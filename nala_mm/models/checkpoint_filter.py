"""Adapt the authors' classification checkpoints (spec §3) to the dense backbone, loudly.

mmengine's stock ``Pretrained`` init unwraps only ``state_dict``; fed the authors' DeiT-style
``{'model': ..., 'model_ema': ...}`` file it loads nothing and says nothing. Here the filter is a
pure function, and the loader refuses any file that would leave backbone tensors unloaded, or
whose stored RoPE frequencies are not the ones this backbone rebuilds at run time.
"""
import os.path as osp
import re
from typing import Dict, List, Mapping, Sequence, Tuple

from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader
from torch import Tensor, nn

# Classification tail of the authors' model; not part of a dense backbone.
TAIL_PREFIXES = ('proj.', 'norm.', 'head.')
# The released model's per-stage RoPE frequencies (a buffer). The backbone rebuilds its tables
# from the input size, so these are not loaded, but they are checked against what it rebuilds.
ROPE_KEY = re.compile(r'^layers\.(\d+)\.RoPE\.angle$')
# Ours, not the authors': missing from their files by design, kept at initialisation.
NEW_KEY = re.compile(r'^out_norm\d\.')
# Largest relative difference tolerated between stored and rebuilt frequencies: float32
# rounding of base**x differs by a few ulps between formulations; a wrong formula differs by %.
ROPE_RTOL = 1e-5


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


def _strip_prefix(weights: Mapping, prefix: str, only_matching: bool) -> Dict[str, Tensor]:
    """Drop ``prefix`` from every key; with ``only_matching`` keep just the keys that had it."""
    out = {}
    for key, value in weights.items():
        if key.startswith(prefix):
            out[key[len(prefix):]] = value
        elif not only_matching:
            out[key] = value
    return out


def backbone_weights(checkpoint: Mapping, use_ema: bool = False) -> Dict[str, Tensor]:
    """Every tensor of the backbone in a checkpoint, under the backbone's own key names.

    Accepts the authors' files (``model``/``model_ema``), mmengine checkpoints
    (``state_dict``) and bare state dicts, with the wrappers a training run adds: ``module.``
    (DDP) and ``backbone.`` (a whole segmentor/detector, whose heads are left out), in any
    combination (``module.backbone.*`` from a distributed whole-model run).
    """
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f'a checkpoint must be a dict, got {type(checkpoint).__name__}')
    weights = dict(_unwrap(checkpoint, use_ema))
    if weights and all(key.startswith('module.') for key in weights):
        weights = _strip_prefix(weights, 'module.', only_matching=False)
    if any(key.startswith('backbone.') for key in weights):
        weights = _strip_prefix(weights, 'backbone.', only_matching=True)
    return weights


def split_released_parts(weights: Mapping) -> Tuple[Dict[str, Tensor], Dict[int, Tensor]]:
    """Backbone weights -> (loadable tensors without the classification tail, RoPE frequency
    buffers by stage index)."""
    state, rope = {}, {}
    for key, value in weights.items():
        match = ROPE_KEY.match(key)
        if match:
            rope[int(match.group(1))] = value
        elif not key.startswith(TAIL_PREFIXES):
            state[key] = value
    return state, rope


def filter_authors_checkpoint(checkpoint: Mapping, use_ema: bool = False) -> Dict[str, Tensor]:
    """Authors' (or converted, or whole-model) checkpoint -> backbone ``state_dict``."""
    return split_released_parts(backbone_weights(checkpoint, use_ema))[0]


def check_rope_frequencies(stored: Mapping[int, Tensor], expected: Sequence[Tensor],
                           source: str) -> None:
    """Refuse a checkpoint whose ``layers.{i}.RoPE.angle`` differs from the frequencies the
    backbone rebuilds (``expected[i]``, in the same repeated-per-pair layout)."""
    for stage, angle in sorted(stored.items()):
        if not 0 <= stage < len(expected):
            raise ValueError(f'{source}: layers.{stage}.RoPE.angle belongs to no stage of this '
                             f'NaLaFormer ({len(expected)} stages)')
        want = expected[stage]
        if tuple(angle.shape) != tuple(want.shape):
            raise ValueError(
                f'{source}: layers.{stage}.RoPE.angle has shape {tuple(angle.shape)}, but stage '
                f'{stage} of this NaLaFormer rebuilds {tuple(want.shape)} RoPE frequencies '
                f'(head dim {2 * want.numel()}); is it another variant? check `arch`')
        relative = ((angle.double() - want.double()).abs() / want.double().abs()).max().item()
        if relative > ROPE_RTOL:
            raise ValueError(
                f'{source}: the RoPE frequencies stored for stage {stage} (layers.{stage}.RoPE.'
                f'angle) differ from the released ones this backbone rebuilds, '
                f'10000^(-i/(d/4-1)), by up to {relative:.3g} (relative; tolerance '
                f'{ROPE_RTOL:g}). The model would rotate positions differently from the one '
                f'that was trained: refusing to load.')


def _describe(keys: List[str], what: str, limit: int = 12) -> str:
    shown = ', '.join(keys[:limit]) + (f', ... ({len(keys) - limit} more)' if len(keys) > limit else '')
    return f'{len(keys)} {what}: {shown}'


def load_authors_checkpoint(model: nn.Module, path: str, use_ema: bool = False) -> Dict[str, int]:
    """Load ``path`` into a NaLaFormer ``model`` or raise listing every missing / unexpected /
    mis-shaped key and any RoPE frequency that differs from the model's."""
    checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    state, rope = split_released_parts(backbone_weights(checkpoint, use_ema))
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
    check_rope_frequencies(rope, model.rope_angle_buffers(), path)
    model.load_state_dict(state, strict=False)
    kept = [k for k in own if k not in state]
    n_params = sum(v.numel() for v in state.values())
    print_log(f'NaLaFormer: loaded {len(state)} tensors ({n_params / 1e6:.2f}M values) from {path}'
              f'{" (EMA weights)" if use_ema else ""}; RoPE frequencies '
              f'{"checked for " + str(len(rope)) + " stages" if rope else "not stored (not checked)"}'
              f'; {len(kept)} new keys keep their initialisation ({", ".join(kept) or "none"})',
              logger='current')
    if rope:  # the released model's layout: its weights were trained with the ReLU split
        cosine = model.nala_layers_with_kernel('cosine')
        if cosine:
            print_log(
                f"NaLaFormer: {path} holds the authors' released weights, trained with the "
                f"ReLU-split kernel, but {len(cosine)} NaLa layers here use kernel='cosine' (the "
                f"paper's cosine inhibit, alpha={cosine[0].cfg.alpha:g}). Each layer then "
                f"differs slightly from the released one and the differences accumulate "
                f"(~2e-3 relative in the stage features of NaLaFormer-T): set kernel='relu' to "
                f'run the released model.', logger='current', level=30)  # logging.WARNING
    return dict(loaded=len(state), kept=len(kept), rope_checked=len(rope))


def missing_checkpoint_message(path: str, variant: str, training_overrides: List[str]) -> str:
    """What to do when ``init_cfg.checkpoint`` names no file: fetch it, point at it, or train
    from scratch with exact ``--cfg-options``."""
    scratch = ' '.join(['model.backbone.init_cfg=None', *training_overrides])
    return (f"NaLaFormer: the pretrained checkpoint {path!r} (model.backbone.init_cfg.checkpoint) "
            f'does not exist (looked for {osp.abspath(path)}). This config fine-tunes from the '
            f"authors' ImageNet weights of NaLaFormer-{variant}: put their file there (the "
            f"authors' .pth loads as it is, or convert it with tools/convert_checkpoint.py), "
            f'set the path once in configs/_base_/nala_pretrained.py, or pass\n'
            f'  --cfg-options model.backbone.init_cfg.checkpoint=PATH\n'
            f'To train from scratch instead (random initialisation, nothing frozen):\n'
            f'  --cfg-options {scratch}')
