"""Helpers shared by the synthetic ADE20K and COCO generators.

Both generators draw random-colour textures, place objects so earlier ones stay visible,
validate the same arguments and cache their output behind a stamp file. The logic lives here
once; what differs (constants, file naming, what the stamp must hold) stays with each caller.
Output depends on every random draw here happening in a fixed order, so any change to these
functions must come with a bump of the callers' ``_FORMAT_VERSION``.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

Grid = Tuple[np.ndarray, np.ndarray]  # (yy, xx) pixel coordinates, each HxW float


def colour_pair(rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """Two random colours with a brightness gap, so a texture stays visible whatever the hue."""
    base = rng.uniform(0, 255, 3)
    if base.mean() > 127:
        other = base * rng.uniform(0.25, 0.55)
    else:
        other = base + (255 - base) * rng.uniform(0.45, 0.75)
    return (base, other) if rng.random() < 0.5 else (other, base)


def mix(t: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Blend two colours with a per-pixel weight ``t`` in [0, 1]."""
    return first + t[..., None] * (second - first)


def keeps_others_visible(owner: np.ndarray, mask: np.ndarray, areas: List[int],
                         min_visible: float) -> bool:
    """Whether drawing ``mask`` on top leaves every earlier object mostly visible.

    ``owner`` holds, per pixel, the index of the object drawn last there (-1 for none) and
    ``areas`` the full pixel count of each object; each must keep ``min_visible`` of it.
    """
    trial = np.where(mask, len(areas), owner)
    # Shift by one so the -1 background lands in bin 0 and object k in bin k + 1.
    visible = np.bincount(trial.ravel() + 1, minlength=len(areas) + 2)[1:len(areas) + 1]
    return bool(np.all(visible >= min_visible * np.asarray(areas)))


def validate_args(num_train: int, num_val: int, image_size: Tuple[int, int],
                  seed: int) -> Tuple[int, int]:
    """Check the generator arguments before anything is written; return (height, width)."""
    for name, value in (('num_train', num_train), ('num_val', num_val)):
        if int(value) != value or value < 1:
            raise ValueError(f'{name} must be an integer >= 1, got {value!r}')
    if len(image_size) != 2:
        raise ValueError(f'image_size must be (height, width), got {image_size!r}')
    for value in image_size:
        if int(value) != value or value < 32:
            raise ValueError(
                f'image_size entries must be integers >= 32, got {value!r} in {image_size!r}')
    if int(seed) != seed or seed < 0:
        raise ValueError(f'seed must be a non-negative integer, got {seed!r}')
    return int(image_size[0]), int(image_size[1])


def stamp_params(format_version: int, num_train: int, num_val: int, height: int, width: int,
                 seed: int) -> Dict[str, Any]:
    """Everything the output depends on; a stamp with other params means regenerate."""
    return {'format_version': format_version, 'num_train': num_train, 'num_val': num_val,
            'image_size': [height, width], 'seed': seed}


def read_stamp(path: str) -> Optional[dict]:
    """The stamp's content, or None when it is missing or unreadable."""
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def stamp_is_current(stamp: Optional[dict], params: Dict[str, Any], expected: Iterable[str],
                     required_keys: Sequence[str] = ()) -> bool:
    """Whether an earlier run with the same params finished and its files are all still there."""
    # Check the files too: a user may have deleted some while leaving the stamp behind.
    return (stamp is not None and stamp.get('params') == params
            and all(key in stamp for key in required_keys)
            and all(map(os.path.isfile, expected)))


def write_stamp(path: str, content: dict) -> None:
    """Write the stamp atomically; call it last, so an interrupted run never looks complete."""
    tmp_path = path + '.tmp'
    with open(tmp_path, 'w', encoding='utf-8') as f:
        json.dump(content, f, indent=2)
    os.replace(tmp_path, path)


def remove_stale(directory: str, wanted: Iterable[str],
                 is_generated: Callable[[str], bool]) -> None:
    """Delete generated files of an earlier, larger run that are not in ``wanted``.

    The dataset loaders take every file they find, so leftovers would silently join the data.
    ``is_generated`` limits the clean-up to names this generator could have written.
    """
    keep = set(wanted)
    for name in os.listdir(directory):
        if is_generated(name) and name not in keep:
            os.remove(os.path.join(directory, name))
