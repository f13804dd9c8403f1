"""The one way the package reads tensors out of a checkpoint file's contents.

Checkpoints arrive in several wrappings: mmengine's ``{'state_dict': ...}``, the DeiT/timm
``{'model': ..., 'model_ema': ...}`` (the authors' files), bare state dicts; keys under a
data-parallel ``module.`` prefix; a whole segmentor's or detector's keys under ``backbone.``
beside its heads. One behaviour for all of them:

* a wrapper prefix (``module.``) is stripped only when every key carries it, so a model that
  happens to own a submodule called ``module`` keeps its names;
* where a backbone is loaded (:func:`backbone_state_dict`), a whole model's heads are dropped and
  its ``backbone.`` prefix removed.

And one way to name the tensors a model holds with another shape (:func:`shape_mismatches`,
:func:`describe_shapes`), which every loader's error or log lists.
"""
from collections.abc import Mapping
from typing import Dict, List, Tuple

from torch import Tensor

# Top-level entries that hold the state dict: mmengine's, then DeiT/timm's.
STATE_KEYS = ('state_dict', 'model')
EMA_KEY = 'model_ema'
WRAPPER_PREFIX = 'module.'
BACKBONE_PREFIX = 'backbone.'


def _keys_preview(mapping: Mapping) -> list:
    return sorted(map(str, mapping))[:10]


def state_dict_of(checkpoint: Mapping, use_ema: bool = False) -> Dict[str, Tensor]:
    """The tensors inside a checkpoint's contents, a ``module.`` wrapper removed.

    ``use_ema`` takes the ``model_ema`` entry (the authors' EMA weights) instead.
    """
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f'a checkpoint must be a dict, got {type(checkpoint).__name__}')
    if use_ema:
        if not isinstance(checkpoint.get(EMA_KEY), Mapping):
            raise KeyError(f'use_ema=True but the checkpoint has no {EMA_KEY!r} entry; it has '
                           f'{_keys_preview(checkpoint)}')
        state = checkpoint[EMA_KEY]
    else:
        state = next((checkpoint[key] for key in STATE_KEYS
                      if isinstance(checkpoint.get(key), Mapping)), checkpoint)
    if not state or not all(isinstance(value, Tensor) for value in state.values()):
        raise KeyError(f'the checkpoint holds neither {" nor ".join(map(repr, STATE_KEYS))} nor '
                       f'bare tensors; its top-level keys are {_keys_preview(checkpoint)}')
    return strip_wrapper(state, WRAPPER_PREFIX)


def strip_wrapper(state: Mapping[str, Tensor], prefix: str) -> Dict[str, Tensor]:
    """``prefix`` removed from every key when every key carries it; else ``state`` unchanged."""
    if state and all(key.startswith(prefix) for key in state):
        return {key[len(prefix):]: value for key, value in state.items()}
    return dict(state)


def backbone_state_dict(checkpoint: Mapping, use_ema: bool = False) -> Dict[str, Tensor]:
    """A backbone's tensors, keys relative to it: a whole segmentor's or detector's checkpoint
    (keys under ``backbone.``) gives its backbone alone; a backbone checkpoint passes as it is."""
    state = state_dict_of(checkpoint, use_ema)
    if any(key.startswith(BACKBONE_PREFIX) for key in state):
        return {key[len(BACKBONE_PREFIX):]: value for key, value in state.items()
                if key.startswith(BACKBONE_PREFIX)}
    return state


Shape = Tuple[int, ...]


def shape_mismatches(state: Mapping[str, Tensor], model_state: Mapping[str, Tensor]
                     ) -> Dict[str, Tuple[Shape, Shape]]:
    """The keys of ``state`` that ``model_state`` holds with another shape -> (the checkpoint's
    shape, the model's), in ``state``'s order; keys the model does not hold are not checked."""
    return {key: (tuple(value.shape), tuple(model_state[key].shape))
            for key, value in state.items()
            if key in model_state and value.shape != model_state[key].shape}


def describe_shapes(mismatches: Mapping[str, Tuple[Shape, Shape]]) -> List[str]:
    """``'key (checkpoint shape) vs model (model shape)'`` per entry of
    :func:`shape_mismatches`."""
    return [f'{key} {stored} vs model {own}' for key, (stored, own) in mismatches.items()]
