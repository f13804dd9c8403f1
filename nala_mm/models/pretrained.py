"""The authors' ImageNet checkpoints as data, and the one filter that fits a checkpoint to the
backbone.

:data:`PRETRAINED` says, per variant, how the authors' file is laid out (docs/user_guides/method.md,
"Authors' checkpoints"); where the configs expect it is ``configs/_base_/nala_pretrained.py``'s.
:func:`checkpoint_filter` is a pure
function ``(checkpoint, model) -> state_dict``: it accepts the authors' DeiT-style files, the
converted ones and whole-model training checkpoints, and refuses, listing every problem, any
checkpoint that would leave backbone tensors unloaded or whose stored RoPE frequencies are not the
ones the model rebuilds. The backbone's ``init_weights`` (:func:`load_pretrained`) and
tools/convert_checkpoint.py both go through it; mmengine's stock ``Pretrained`` initialisation
would unwrap only ``state_dict`` and, fed an authors' file, load nothing and say nothing.
"""
import argparse
import os.path as osp
import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

import torch
from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader
from torch import Tensor, nn

from ..ops import rope_angle_buffer
from .mixer_specs import DEFAULT_HYBRID
from .mixers import NormAwareLinearAttention
from .state_dicts import backbone_state_dict, describe_shapes, shape_mismatches


@dataclass(frozen=True)
class AuthorsCheckpoint:
    """One of the authors' ImageNet-1K classification checkpoints.

    Attributes:
        trained_kernel: the NaLa kernel the weights were trained with: the released code's
            ReLU split, not the paper's cosine inhibit (docs/user_guides/method.md, "Paper vs
            released code").
        tail_prefixes: the classification tail (final projection, norm, head), which a dense
            backbone does not have.
        mixers: the stages' token mixers the weights were trained with, as ``mixers`` entries;
            ``'nala'`` stands for NaLa with ``trained_kernel``.
    """
    trained_kernel: str = 'relu'
    tail_prefixes: Tuple[str, ...] = ('proj.', 'norm.', 'head.')
    mixers: Tuple[str, ...] = DEFAULT_HYBRID

    def trained_mixers(self) -> tuple:
        """``mixers`` for :class:`~nala_mm.models.NaLaFormer` that run the released model."""
        nala = dict(type='NormAwareLinearAttention', kernel=self.trained_kernel)
        return tuple(dict(nala) if entry == 'nala' else entry for entry in self.mixers)


# One entry per variant of nala_mm.models.nalaformer.ARCH_SETTINGS: the released files share
# one layout. Also the layout of a backbone built from an explicit arch dict.
RELEASED_LAYOUT = AuthorsCheckpoint()
PRETRAINED: Dict[str, AuthorsCheckpoint] = dict.fromkeys(('xt', 't', 's', 'b', 'l'),
                                                        RELEASED_LAYOUT)

# The released model's per-stage RoPE frequencies (a buffer). The backbone rebuilds its tables
# from the input size, so these are not loaded, but they are checked against what it rebuilds.
ROPE_KEY = re.compile(r'^layers\.(\d+)\.RoPE\.angle$')
# Ours, not the authors': missing from their files by design, kept at initialisation.
NEW_KEY = re.compile(r'^out_norm\d\.')
# Largest relative difference tolerated between stored and rebuilt frequencies: float32
# rounding of base**x differs by a few ulps between formulations; a wrong formula differs by %.
ROPE_RTOL = 1e-5


def layout_of(model: nn.Module) -> AuthorsCheckpoint:
    """The authors' checkpoint entry of ``model``'s variant (the shared layout for a custom
    arch)."""
    return PRETRAINED.get(str(getattr(model, 'variant', '')).lower(), RELEASED_LAYOUT)


def rope_angle_buffers(model: nn.Module) -> List[Tensor]:
    """Per stage, the RoPE frequencies ``model`` rebuilds, in the released checkpoints'
    ``layers.{i}.RoPE.angle`` layout (each repeated for its channel pair)."""
    return [rope_angle_buffer(stage.blocks[0].attn.head_dims, stage.blocks[0].attn.rope_base)
            for stage in model.layers]


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


def describe_keys(keys: List[str], what: str, limit: int = 12) -> str:
    """``'N what: k1, k2, ...'`` with at most ``limit`` keys named: one problem line of a
    checkpoint report (used by the backbone's and the classifier's loaders)."""
    more = f', ... ({len(keys) - limit} more)' if len(keys) > limit else ''
    shown = ', '.join(keys[:limit]) + more
    return f'{len(keys)} {what}: {shown}'


def checkpoint_filter(checkpoint: Mapping, model: nn.Module, use_ema: bool = False,
                      keep_rope: bool = False, source: str = 'the checkpoint') -> Dict[str, Tensor]:
    """A checkpoint (or a bare state dict) -> the ``state_dict`` to load into the NaLaFormer
    ``model``.

    Reads the checkpoint through :func:`nala_mm.models.state_dicts.backbone_state_dict`
    (``model`` / ``model_ema`` with ``use_ema`` / ``state_dict``, the ``module.`` and
    ``backbone.`` prefixes), drops the classification tail, checks the stored RoPE frequencies
    ``layers.{i}.RoPE.angle`` against the ones ``model`` rebuilds and returns them only with
    ``keep_rope`` (a converted file keeps them, so that every later load checks them again).
    The result covers every tensor of ``model`` except its ``out_norm{i}`` norms, which the
    authors' model does not have. Raises ``ValueError`` listing every missing, unexpected and
    mis-shaped key (``source`` names the checkpoint in the messages). Reads ``model``'s
    structure only: nothing is loaded.
    """
    layout = layout_of(model)
    weights = backbone_state_dict(checkpoint, use_ema)
    state, rope = {}, {}
    for key, value in weights.items():
        match = ROPE_KEY.match(key)
        if match:
            rope[int(match.group(1))] = (key, value)
        elif not key.startswith(layout.tail_prefixes):
            state[key] = value
    own = model.state_dict()
    missing = [k for k in own if k not in state and not NEW_KEY.match(k)]
    unexpected = [k for k in state if k not in own]
    mis_shaped = describe_shapes(shape_mismatches(state, own))
    if missing or unexpected or mis_shaped:
        problems = [describe_keys(keys, what) for keys, what in (
            (missing, 'backbone keys missing from the checkpoint'),
            (unexpected, 'unexpected keys in the checkpoint'),
            (mis_shaped, 'mis-shaped tensors')) if keys]
        raise ValueError(f'{source} does not fit this NaLaFormer (is it another variant? check '
                         f'`arch`):\n  ' + '\n  '.join(problems))
    check_rope_frequencies({stage: angle for stage, (_, angle) in rope.items()},
                           rope_angle_buffers(model), source)
    if keep_rope:
        state.update(dict(rope.values()))
    return state


def _from_scratch_overrides(model: nn.Module) -> List[str]:
    """Options that undo what only makes sense on top of pretrained weights: a frozen,
    randomly initialised stem or BN statistics that never leave their initial values."""
    overrides = []
    if getattr(model, 'frozen_stages', -1) >= 0:
        overrides.append('model.backbone.frozen_stages=-1')
    if getattr(model, 'norm_eval', False):
        overrides.append('model.backbone.norm_eval=False')
    return overrides


def missing_checkpoint_message(path: str, model: nn.Module) -> str:
    """What to do when ``init_cfg.checkpoint`` names no file: fetch it, point at it, or train
    from scratch with exact ``--cfg-options``."""
    scratch = ' '.join(['model.backbone.init_cfg=None', *_from_scratch_overrides(model)])
    variant = getattr(model, 'variant', 'custom')
    return (f"NaLaFormer: the pretrained checkpoint {path!r} (model.backbone.init_cfg.checkpoint) "
            f'does not exist (looked for {osp.abspath(path)}). This config fine-tunes from the '
            f"authors' ImageNet weights of NaLaFormer-{variant}: put their file there (the "
            f"authors' .pth loads as it is, or convert it with tools/convert_checkpoint.py), "
            f'set the path once in configs/_base_/nala_pretrained.py, or pass\n'
            f'  --cfg-options model.backbone.init_cfg.checkpoint=PATH\n'
            f'To train from scratch instead (random initialisation, nothing frozen):\n'
            f'  --cfg-options {scratch}')


def load_pretrained(model: nn.Module, path: str, use_ema: bool = False) -> Dict[str, int]:
    """Load the checkpoint at ``path`` into the NaLaFormer ``model`` through
    :func:`checkpoint_filter`, logging what was loaded and what kept its initialisation.

    Warns when the authors' released weights (recognised by their stored RoPE frequencies) load
    into NaLa layers whose kernel is not the one they were trained with.
    """
    if '://' not in str(path) and not osp.isfile(path):  # local paths only
        raise FileNotFoundError(missing_checkpoint_message(path, model))
    # The authors' DeiT-style files hold their command line as an argparse.Namespace ('args')
    # beside the weights: a plain attribute holder, allowed for this load only (weights-only
    # unpickling stays on; nothing of torch's global allow-list changes).
    with torch.serialization.safe_globals([argparse.Namespace]):
        checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    state = checkpoint_filter(checkpoint, model, use_ema=use_ema, keep_rope=True,
                              source=f'checkpoint {path}')
    rope = [key for key in state if ROPE_KEY.match(key)]
    for key in rope:
        del state[key]
    model.load_state_dict(state, strict=False)
    kept = [k for k in model.state_dict() if k not in state]
    n_values = sum(v.numel() for v in state.values())
    checked = f'checked for {len(rope)} stages' if rope else 'not stored (not checked)'
    print_log(f'NaLaFormer: loaded {len(state)} tensors ({n_values / 1e6:.2f}M values) from {path}'
              f'{" (EMA weights)" if use_ema else ""}; RoPE frequencies {checked}; {len(kept)} '
              f'new keys keep their initialisation ({", ".join(kept) or "none"})',
              logger='current')
    trained = layout_of(model).trained_kernel
    others = Counter(m.cfg.kernel for m in model.modules()
                     if isinstance(m, NormAwareLinearAttention) and m.cfg.kernel != trained)
    if rope and others:  # the released layout: weights trained with `trained`
        layers = ' and '.join(f'{count} NaLa layers here use kernel={kernel!r}'
                              for kernel, count in sorted(others.items()))
        print_log(
            f"NaLaFormer: {path} holds the authors' released weights, trained with "
            f"kernel={trained!r} (the released code's), but {layers}. Each such layer then "
            f'differs slightly from the released one and the differences accumulate through the '
            f'stages: set kernel={trained!r} in their mixer configs, e.g. '
            f"dict(type='NormAwareLinearAttention', kernel={trained!r}), to run the released "
            f'model.', logger='current', level=30)  # logging.WARNING
    return dict(loaded=len(state), kept=len(kept), rope_checked=len(rope))
