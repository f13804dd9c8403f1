"""Synthetic street scenes in the exact Cityscapes layout and label convention, for trying the
Cityscapes configs without the real data (``python -m nala_mm.datasets.synthetic_cityscapes``)
and for the tests.

Layout (what mmseg's ``CityscapesDataset`` reads, with the train-ID label maps that
``tools/dataset_converters/cityscapes.py`` writes)::

    root/leftImg8bit/{train,val}/{city}/{city}_000000_{frame:06d}_leftImg8bit.png
    root/gtFine/{train,val}/{city}/{city}_000000_{frame:06d}_gtFine_labelTrainIds.png

Label PNGs hold the 19 train IDs (0 road ... 18 bicycle, in mmseg's class order) and 255 for
unlabelled pixels. A scene is a sky above a wavy horizon, buildings and vegetation along it, a
road with a sidewalk band, and cars, people and poles on top; every colour is drawn per instance
(so colour alone does not name a class) and each class keeps its own texture.
"""
from __future__ import annotations

import argparse
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mmseg.datasets import CityscapesDataset
from PIL import Image
from tqdm import tqdm

from . import synthetic_common as common
from .synthetic_common import colour_pair, mix

# in train-ID order
CITYSCAPES_CLASSES: Tuple[str, ...] = tuple(CityscapesDataset.METAINFO['classes'])
TRAIN_ID = {name: i for i, name in enumerate(CITYSCAPES_CLASSES)}
IGNORE = 255
# the classes the scenes draw (a subset, as a small real crop would hold)
DRAWN_CLASSES: Tuple[str, ...] = ('road', 'sidewalk', 'building', 'pole', 'vegetation', 'sky',
                                  'person', 'car')
_SPLITS = (('train', ('aachen', 'bochum')), ('val', ('frankfurt',)))
_STAMP_NAME = '.synthetic_cityscapes.json'
# bump when anything that changes the output changes
_FORMAT_VERSION = 1
IMAGE_SUFFIX, LABEL_SUFFIX = '_leftImg8bit.png', '_gtFine_labelTrainIds.png'


def _texture(rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray, kind: str) -> np.ndarray:
    """A class's texture in [0, 1]: stripes for buildings' floors, blobs for vegetation, a fine
    grain for asphalt, a vertical gradient for the sky."""
    if kind == 'building':
        return ((yy // rng.uniform(4, 9)) % 2).astype(np.float32)
    if kind == 'vegetation':
        scale = rng.uniform(3, 7)
        return (np.sin(xx / scale + rng.uniform(0, 6)) * np.sin(yy / scale) > 0).astype(
            np.float32)
    if kind == 'sky':
        return yy / max(float(yy.max()), 1.0)
    return rng.uniform(0, 1, yy.shape).astype(np.float32) * 0.4


def _paint(image: np.ndarray, label: np.ndarray, mask: np.ndarray, rgb: np.ndarray,
           name: str) -> None:
    image[mask] = rgb[mask]
    label[mask] = TRAIN_ID[name]


def _render(rng: np.random.Generator, height: int,
            width: int) -> Tuple[np.ndarray, np.ndarray]:
    """One scene: (RGB uint8 image, train-ID uint8 label map)."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.zeros((height, width, 3), np.float32)
    label = np.full((height, width), IGNORE, np.uint8)

    def layer(name: str, mask: np.ndarray) -> None:
        _paint(image, label, mask, mix(_texture(rng, yy, xx, name), *colour_pair(rng)), name)

    horizon = height * rng.uniform(0.35, 0.55) + rng.uniform(1, 0.05 * height) * np.sin(
        2 * np.pi * xx / rng.uniform(0.6 * width, 1.4 * width) + rng.uniform(0, 2 * np.pi))
    layer('sky', yy < horizon)
    # buildings and trees stand on the horizon, alternating along it
    left = 0.0
    while left < width:
        right = left + rng.uniform(0.12, 0.35) * width
        top = horizon - rng.uniform(0.1, 0.3) * height
        name = 'building' if rng.random() < 0.6 else 'vegetation'
        layer(name, (xx >= left) & (xx < right) & (yy >= top) & (yy < horizon))
        left = right
    ground = yy >= horizon
    layer('road', ground)
    kerb = horizon + (height - horizon) * rng.uniform(0.15, 0.3)
    layer('sidewalk', ground & (yy < kerb))
    for _ in range(int(rng.integers(1, 3))):  # poles on the sidewalk, up into the sky
        x0 = rng.uniform(0, width - 3)
        layer('pole', (xx >= x0) & (xx < x0 + max(2.0, width / 80)) & (yy < kerb)
              & (yy >= horizon - rng.uniform(0.2, 0.35) * height))
    for name, (lo, hi), count in (('car', (0.08, 0.2), int(rng.integers(1, 4))),
                                  ('person', (0.03, 0.06), int(rng.integers(1, 3)))):
        for _ in range(count):
            w = rng.uniform(lo, hi) * width
            h = w * (0.55 if name == 'car' else 2.6)
            x0, bottom = rng.uniform(0, width - w), rng.uniform(kerb, height)
            layer(name, (xx >= x0) & (xx < x0 + w) & (yy >= bottom - h) & (yy < bottom)
                  & ground)
    image += rng.normal(0, rng.uniform(2, 5), image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), label


def _stems(city: str, count: int) -> List[str]:
    return [f'{city}_000000_{frame:06d}' for frame in range(count)]


def _split_counts(num: int, cities: Tuple[str, ...]) -> Dict[str, int]:
    """Images per city, the first cities taking the remainder."""
    return {city: num // len(cities) + (i < num % len(cities)) for i, city in enumerate(cities)}


def generate_cityscapes_like(root: str, num_train: int = 8, num_val: int = 4,
                             image_size: Tuple[int, int] = (128, 256), seed: int = 0,
                             progress: bool = True) -> dict:
    """Write a synthetic Cityscapes-layout dataset under ``root`` (skipped if already there).

    Args:
        root: dataset root (the ``data_root`` of an mmseg Cityscapes config).
        num_train, num_val: images per split, spread over the split's cities.
        image_size: (height, width); Cityscapes' own aspect is 1:2.
        seed: base seed; each image uses its own generator seeded by (seed, split, index).
        progress: show a tqdm progress bar.

    Returns:
        dict with ``root``, ``num_train``, ``num_val``, ``classes`` (the 19) and
        ``class_pixel_fraction`` (share of labelled validation pixels per drawn class).
    """
    height, width = common.validate_args(num_train, num_val, image_size, seed)
    root = os.fspath(root)
    params = common.stamp_params(_FORMAT_VERSION, int(num_train), int(num_val), height, width,
                                 int(seed))
    stamp_path = os.path.join(root, _STAMP_NAME)
    plan = {split: _split_counts(count, cities) for (split, cities), count in
            zip(_SPLITS, (int(num_train), int(num_val)))}
    files = [(split, city, stem) for split, cities in plan.items()
             for city, count in cities.items() for stem in _stems(city, count)]
    expected = [os.path.join(root, kind, split, city, stem + suffix)
                for split, city, stem in files
                for kind, suffix in (('leftImg8bit', IMAGE_SUFFIX), ('gtFine', LABEL_SUFFIX))]

    def summary(fractions: Dict[str, float]) -> dict:
        return {'root': root, 'num_train': params['num_train'], 'num_val': params['num_val'],
                'classes': CITYSCAPES_CLASSES, 'class_pixel_fraction': fractions}

    stamp = common.read_stamp(stamp_path)
    if common.stamp_is_current(stamp, params, expected, required_keys=('class_pixel_fraction',)):
        return summary(stamp['class_pixel_fraction'])

    for split, cities in plan.items():
        for city, count in cities.items():
            wanted = set(_stems(city, count))
            for kind, suffix in (('leftImg8bit', IMAGE_SUFFIX), ('gtFine', LABEL_SUFFIX)):
                directory = os.path.join(root, kind, split, city)
                os.makedirs(directory, exist_ok=True)
                common.remove_stale(directory, [s + suffix for s in wanted],
                                    lambda name, suffix=suffix: name.startswith(city + '_')
                                    and name.endswith(suffix))
    val_pixels = np.zeros(len(CITYSCAPES_CLASSES), np.int64)
    split_codes = {split: code for code, (split, _) in enumerate(_SPLITS)}
    for index, (split, city, stem) in enumerate(tqdm(files, desc='synthetic Cityscapes',
                                                     disable=not progress)):
        rng = np.random.default_rng([int(seed), split_codes[split], index])
        image, label = _render(rng, height, width)
        Image.fromarray(image).save(os.path.join(root, 'leftImg8bit', split, city,
                                                 stem + IMAGE_SUFFIX))
        Image.fromarray(label).save(os.path.join(root, 'gtFine', split, city,
                                                 stem + LABEL_SUFFIX))
        if split == 'val':
            val_pixels += np.bincount(label[label != IGNORE].ravel(),
                                      minlength=len(CITYSCAPES_CLASSES))[:len(CITYSCAPES_CLASSES)]
    total = float(val_pixels.sum())
    fractions = {name: float(val_pixels[TRAIN_ID[name]]) / total for name in DRAWN_CLASSES}
    common.write_stamp(stamp_path, {'params': params, 'class_pixel_fraction': fractions})
    return summary(fractions)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m nala_mm.datasets.synthetic_cityscapes',
        description="Generate synthetic street scenes in Cityscapes' layout (train-ID labels) "
                    "where mmseg's Cityscapes configs read them, to try a Cityscapes config "
                    '(configs/swap/cityscapes_*) without the real data')
    parser.add_argument('--root', default='data/cityscapes', help='dataset root')
    parser.add_argument('--num-train', type=int, default=8, help='training images')
    parser.add_argument('--num-val', type=int, default=4, help='validation images')
    parser.add_argument('--size', type=int, nargs=2, default=(128, 256), metavar=('H', 'W'),
                        help='image size (Cityscapes is 1024 x 2048)')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    try:
        result = generate_cityscapes_like(args.root, args.num_train, args.num_val,
                                          tuple(args.size), args.seed)
    except ValueError as error:  # the generator names the bad value
        parser.error(str(error))
    print(f"{result['num_train']} training and {result['num_val']} validation images in "
          f"{result['root']}")


if __name__ == '__main__':
    main()
