"""NaLaFormer as an mmpretrain image classifier: the authors' classification tail, and their
checkpoints in mmpretrain's ``ImageClassifier``.

The released classifier (docs/user_guides/method.md) ends with a projection of every stage-4 token
to 1024 channels, BatchNorm, SiLU (their "Swish"), global average pooling and a 1x1-conv head. In
mmpretrain's ``ImageClassifier`` that is::

    backbone  NaLaFormer(out_indices=(3,), out_norm_cfg=None)   mmengine's root registry
    neck      NaLaFormerClsNeck: proj, norm, SiLU, pooling       mmpretrain's registry
    head      LinearClsHead(in_channels=1024)                    mmpretrain's own

A 1x1 conv on a pooled 1x1 map is a linear layer, so the head is mmpretrain's stock linear head;
the authors' ``head.weight`` of shape ``(K, 1024, 1, 1)`` is its ``head.fc.weight`` ``(K, 1024)``.
Their ``proj.*`` and ``norm.*`` are the neck's ``neck.proj.*`` and ``neck.norm.*``.

An authors' file (``{'model': ..., 'model_ema': ..., 'optimizer': ..., 'epoch': ...}``) carries no
``state_dict``: mmengine would load nothing from it, and mmpretrain's ``EMAHook`` would fail on
the missing key. :class:`~nala_mm.engine.hooks.AuthorsCheckpointHook` (the ImageNet configs
list it) rewrites such a file, when the Runner loads it (``load_from``, mmpretrain's
``tools/test.py CONFIG CHECKPOINT``), into the layout of a checkpoint saved by an mmpretrain run
with ``EMAHook``, through :func:`convert_authors_checkpoint`. This module is imported by
``import nala_mm`` only when mmpretrain is installed.
"""
from collections.abc import Mapping
from typing import Dict, Optional, Sequence, Tuple

from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule, is_model_wrapper
from torch import Tensor, nn

from ..registry import register_model
from .pretrained import checkpoint_filter, describe_keys, layout_of
from .state_dicts import EMA_KEY, WRAPPER_PREFIX, describe_shapes, shape_mismatches, strip_wrapper

# The width of the released tail (their ``projection=1024``, the same for every variant).
PROJECTION = 1024
# Authors' tail key prefix -> the ImageClassifier's.
TAIL_RENAMES = (('proj.', 'neck.proj.'), ('norm.', 'neck.norm.'), ('head.', 'head.fc.'))
# The prefix mmengine's EMA model puts before the averaged model's keys (``ema_state_dict``).
EMA_MODULE_PREFIX = 'module.'


@register_model(scope='mmpretrain')
class NaLaFormerClsNeck(BaseModule):
    """The released classification tail before the head: every token of the last backbone
    output projected to ``out_channels`` (a ``Linear``), BatchNorm over the projected map, SiLU,
    global average pooling. Returns ``(B, out_channels)`` in a tuple, as mmpretrain's necks do.

    Args:
        in_channels: channels of the backbone's last output (the variant's stage-4 width).
        out_channels: the projection's width (1024 in every released variant).
        norm_cfg: the norm after the projection (``dict(type='SyncBN')`` for multi-GPU training,
            as the authors convert every BatchNorm).
        init_cfg: mmengine initialisation; ``None`` keeps PyTorch's defaults (the authors').
    """

    def __init__(self, in_channels: int, out_channels: int = PROJECTION,
                 norm_cfg: dict = dict(type='BN'), init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        for name, value in (('in_channels', in_channels), ('out_channels', out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'NaLaFormerClsNeck: {name} must be a positive integer, got '
                                 f'{value!r}')
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.proj = nn.Linear(in_channels, out_channels)
        self.norm = build_norm_layer(norm_cfg, out_channels)[1]
        self.act = nn.SiLU()

    def forward(self, inputs: Sequence[Tensor]) -> Tuple[Tensor]:
        if not isinstance(inputs, (tuple, list)) or not inputs:
            raise TypeError('NaLaFormerClsNeck expects the backbone outputs, a non-empty tuple of '
                            f'(B, {self.in_channels}, H, W) maps; got {type(inputs).__name__}')
        x = inputs[-1]
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'NaLaFormerClsNeck expects a (B, {self.in_channels}, H, W) map (the '
                             f'last backbone output), got {tuple(x.shape)}: does in_channels '
                             f'match the backbone\'s last stage?')
        x = self.proj(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return (self.act(self.norm(x)).mean(dim=(2, 3)),)


def _classifier_parts(model: nn.Module) -> nn.Module:
    model = model.module if is_model_wrapper(model) else model
    for part in ('backbone', 'neck', 'head'):
        if not isinstance(getattr(model, part, None), nn.Module):
            raise TypeError(f"an authors' NaLaFormer checkpoint loads into an ImageClassifier "
                            f'with a backbone, a neck and a head; {type(model).__name__} has no '
                            f'{part}')
    return model


def classifier_state_dict(state: Mapping, model: nn.Module,
                          source: str = 'the checkpoint') -> Dict[str, Tensor]:
    """The authors' classifier state dict -> the state dict of the ``ImageClassifier`` ``model``
    (NaLaFormer backbone, :class:`NaLaFormerClsNeck`, ``LinearClsHead``).

    The backbone's tensors go through :func:`~nala_mm.models.checkpoint_filter` (every backbone
    tensor present and fitting, the stored RoPE frequencies equal to the rebuilt ones; the buffers
    themselves are not model tensors here); the tail is renamed (``proj.``/``norm.`` ->
    ``neck.proj.``/``neck.norm.``, ``head.`` -> ``head.fc.``, the 1x1-conv weight flattened to a
    linear one). Raises ``ValueError`` listing every missing, unexpected and mis-shaped tensor of
    the backbone and of the tail.
    """
    model = _classifier_parts(model)
    state = strip_wrapper(state, WRAPPER_PREFIX)
    tail_prefixes = layout_of(model.backbone).tail_prefixes
    own = {k: v for k, v in model.state_dict().items() if not k.startswith('backbone.')}
    tail = {}
    for key, value in state.items():
        if not key.startswith(tail_prefixes):
            continue
        for theirs, ours in TAIL_RENAMES:
            if key.startswith(theirs):
                renamed = ours + key[len(theirs):]
                break
        else:
            renamed = key  # a tail prefix this model does not map: reported as unexpected
        if renamed == 'head.fc.weight' and value.dim() == 4 and value.shape[2:] == (1, 1):
            value = value.flatten(1)  # the 1x1 conv as the linear layer it is
        tail[renamed] = value
    problems = []
    missing = [k for k in own if k not in tail]
    unexpected = [k for k in tail if k not in own]
    mis_shaped = describe_shapes(shape_mismatches(tail, own))
    problems += [describe_keys(keys, what) for keys, what in (
        (missing, 'classification-tail keys missing from the checkpoint (neck/head)'),
        (unexpected, 'unexpected classification-tail keys (after renaming)'),
        (mis_shaped, 'mis-shaped tail tensors (is num_classes or the projection width '
                     'different?)')) if keys]
    try:
        backbone = checkpoint_filter(state, model.backbone, source=source)
    except ValueError as error:
        problems.append(str(error))
        backbone = {}
    if problems:
        raise ValueError(f"{source} does not fit this NaLaFormer classifier:\n  "
                         + '\n  '.join(problems))
    return {**{f'backbone.{k}': v for k, v in backbone.items()}, **tail}


def is_authors_checkpoint(checkpoint) -> bool:
    """Whether ``checkpoint`` is laid out as the authors' (DeiT-style) files: a ``model`` state
    dict and no mmengine ``state_dict``."""
    return (isinstance(checkpoint, Mapping) and 'state_dict' not in checkpoint
            and isinstance(checkpoint.get('model'), Mapping))


def convert_authors_checkpoint(checkpoint: Mapping, model: nn.Module,
                               source: str = 'the checkpoint') -> dict:
    """An authors' classification checkpoint -> the layout of an mmpretrain checkpoint of the
    ``ImageClassifier`` ``model`` saved by a run with ``EMAHook``.

    Such a run saves the EMA weights as ``state_dict`` (what a model without the hook loads) and
    the trained ones under ``ema_state_dict`` (keys ``module.*``); ``EMAHook`` swaps them back on
    loading, so that it evaluates the EMA weights and, with ``evaluate_on_origin=True``, the
    trained ones too, as the authors' ``main.py`` evaluates both. A file without ``model_ema``
    gives its ``model`` weights as ``state_dict`` and no ``ema_state_dict``.
    """
    if not is_authors_checkpoint(checkpoint):
        raise KeyError(f"{source} is not an authors' checkpoint (a 'model' state dict and no "
                       f"'state_dict'); its top-level keys are {sorted(map(str, checkpoint))[:10]}")
    trained = classifier_state_dict(checkpoint['model'], model, source=f"{source} ['model']")
    if not isinstance(checkpoint.get(EMA_KEY), Mapping):
        return dict(state_dict=trained, meta=dict(authors_checkpoint=source, ema=False))
    averaged = classifier_state_dict(checkpoint[EMA_KEY], model,
                                     source=f"{source} ['{EMA_KEY}']")
    return dict(state_dict=averaged,
                ema_state_dict={EMA_MODULE_PREFIX + k: v for k, v in trained.items()},
                meta=dict(authors_checkpoint=source, ema=True))
