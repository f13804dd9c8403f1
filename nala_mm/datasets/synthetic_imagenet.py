"""Synthetic classification data in the ImageNet folder layout (the classification demo's).

Each image shows one object in a plain room (a smooth wall over a floor), drawn by the ADE20K-layout
generator's drawers (:mod:`.synthetic_ade`): a window, a plant, a painting or a lamp, whose class
is the image's label. Every colour is drawn at random per image, so the classes can only be told
apart by shape and texture; clutter strokes, an illumination gradient and sensor noise spoil flat
shortcuts.

Layout (what mmpretrain's ``ImageNet`` and ``CustomDataset`` read without an annotation file,
as the authors' torchvision ``ImageFolder`` does; class index = position of the folder in sorted
order, which :data:`CLASSES` is)::

    root/train/{class}/{class}_00000.JPEG
    root/val/{class}/{class}_00000.JPEG
"""
from __future__ import annotations

import os
from typing import List, Tuple

import numpy as np
from PIL import Image
from tqdm import tqdm

from . import synthetic_common as common
from .synthetic_ade import _OBJECT_DRAWERS, _clutter
from .synthetic_common import colour_pair, mix

# Sorted: mmpretrain numbers the class folders in sorted order, and a config's metainfo names
# them in that order.
CLASSES: Tuple[str, ...] = tuple(sorted(_OBJECT_DRAWERS))
_STAMP_NAME = '.synthetic_imagenet.json'
# Bump whenever the rendered output changes, so stale stamps stop matching.
_FORMAT_VERSION = 1
_SPLITS = ('train', 'val')
_DRAW_SIDE = 48  # px: the drawers' objects are 18 to 26 px wide here
_MIN_OBJECT_FRACTION = 0.08  # of the image: an object smaller than this is redrawn
_PLACEMENT_TRIES = 30


def _render(rng: np.random.Generator, label: int, height: int, width: int) -> np.ndarray:
    """One image (RGB uint8) showing one object of class ``CLASSES[label]``, drawn at
    :data:`_DRAW_SIDE` pixels on the shorter side (where the drawers' objects fill a third to a
    half of it, as an ImageNet object fills its photo) and resized to ``height x width``."""
    scale = _DRAW_SIDE / min(height, width)
    h, w = round(height * scale), round(width * scale)
    grid = tuple(np.mgrid[0:h, 0:w].astype(np.float32))
    yy, xx = grid
    # a plain room: a smooth wall over a floor, two random colours each
    is_wall = yy < h * rng.uniform(0.3, 0.7)
    wall, floor = (mix(np.clip(yy / h, 0, 1), *colour_pair(rng)) for _ in range(2))
    image = np.where(is_wall[..., None], wall, floor)
    for _ in range(_PLACEMENT_TRIES):
        mask, rgb = _OBJECT_DRAWERS[CLASSES[label]](rng, grid)
        if mask.mean() >= _MIN_OBJECT_FRACTION:
            break
    image[mask] = rgb[mask]
    image[_clutter(rng, grid)] = rng.uniform(0, 255, 3)
    slope_x, slope_y = rng.uniform(-0.25, 0.25, 2)
    light = 1 + slope_x * (xx / w - 0.5) + slope_y * (yy / h - 0.5)
    image = image * light[..., None] + rng.normal(0, rng.uniform(2, 6), image.shape)
    image = Image.fromarray(np.clip(np.rint(image), 0, 255).astype(np.uint8))
    return np.asarray(image.resize((width, height), Image.BICUBIC))


def _file_names(class_name: str, count: int) -> List[str]:
    return [f'{class_name}_{i:05d}.JPEG' for i in range(count)]


def generate_imagenet_like(root: str, num_train: int = 200, num_val: int = 50,
                           image_size: Tuple[int, int] = (64, 64), seed: int = 0,
                           progress: bool = True) -> dict:
    """Write a synthetic ImageNet-layout dataset under ``root`` (skipped if already there).

    Args:
        root: dataset root (the ``data_root`` of an mmpretrain ImageNet config).
        num_train: training images per class.
        num_val: validation images per class.
        image_size: (height, width) of every image (at least 48: the objects need room).
        seed: base seed; each image uses its own generator seeded by (seed, split, class, index).
        progress: show a tqdm progress bar.

    Returns:
        dict with ``root``, ``num_train`` and ``num_val`` (per class), ``classes``
        (:data:`CLASSES`) and ``chance_top1`` (percent: one class of ``len(CLASSES)``, balanced).
    """
    height, width = common.validate_args(num_train, num_val, image_size, seed)
    if min(height, width) < 48:
        raise ValueError(f'image_size entries must be >= 48 for the objects to fit, got '
                         f'{tuple(image_size)!r}')
    root = os.fspath(root)
    counts = {'train': int(num_train), 'val': int(num_val)}
    params = common.stamp_params(_FORMAT_VERSION, counts['train'], counts['val'], height,
                                 width, int(seed))
    stamp_path = os.path.join(root, _STAMP_NAME)
    summary = {'root': root, 'num_train': counts['train'], 'num_val': counts['val'],
               'classes': CLASSES, 'chance_top1': 100.0 / len(CLASSES)}
    expected = [os.path.join(root, split, name, file)
                for split in _SPLITS for name in CLASSES
                for file in _file_names(name, counts[split])]
    if common.stamp_is_current(common.read_stamp(stamp_path), params, expected):
        return summary

    total = sum(counts.values()) * len(CLASSES)
    with tqdm(total=total, desc='synthetic ImageNet', disable=not progress) as bar:
        for split_code, split in enumerate(_SPLITS):
            for label, name in enumerate(CLASSES):
                folder = os.path.join(root, split, name)
                os.makedirs(folder, exist_ok=True)
                files = _file_names(name, counts[split])
                common.remove_stale(folder, files, lambda f, n=name: f.startswith(n + '_')
                                    and f.endswith('.JPEG'))
                for index, file in enumerate(files):
                    rng = np.random.default_rng([int(seed), split_code, label, index])
                    Image.fromarray(_render(rng, label, height, width)).save(
                        os.path.join(folder, file), quality=90)
                    bar.update()
    common.write_stamp(stamp_path, {'params': params})
    return summary
