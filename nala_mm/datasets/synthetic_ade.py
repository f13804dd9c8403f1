"""Synthetic segmentation data in the exact ADE20K layout and label convention.

The demo has to train a segmentor on two CPU cores in minutes, so the real
ADE20K is out of reach. This generator draws indoor-like scenes whose classes
can only be told apart by texture and shape: every colour is drawn at random
per instance, so a model that keys on colour cannot score.

Layout (what mmseg's ``ADE20KDataset`` reads)::

    root/images/{training,validation}/ADE_{train,val}_00000000.jpg
    root/annotations/{training,validation}/ADE_{train,val}_00000000.png

Label PNGs follow ADE20K: 0 is unlabelled (ignored after ``reduce_zero_label``)
and value ``v >= 1`` is ADE class ``v - 1``, using the real ADE indices of
:data:`DEMO_CLASSES`.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, List, Tuple

import numpy as np
from mmseg.datasets import ADE20KDataset
from PIL import Image
from tqdm import tqdm

from . import synthetic_common as common
from .synthetic_common import Grid, colour_pair, keeps_others_visible, mix

# The 150 ADE20K classes in official order, as mmseg spells them (a trailing space in 'bed ':
# metainfo class subsets are matched by name).
ADE_CLASS_NAMES: Tuple[str, ...] = tuple(ADE20KDataset.METAINFO['classes'])

# Ordered as in ADE20K so a metainfo subset keeps the same class order.
DEMO_CLASSES: Tuple[str, ...] = ('wall', 'floor', 'windowpane', 'plant', 'painting', 'lamp')

_BACKGROUND_CLASSES = ('wall', 'floor')
_OBJECT_CLASSES = ('windowpane', 'plant', 'painting', 'lamp')
# PNG value of each demo class: ADE index + 1, as in the real annotations.
_LABEL_VALUE: Dict[str, int] = {name: ADE_CLASS_NAMES.index(name) + 1 for name in DEMO_CLASSES}

_STAMP_NAME = '.synthetic_ade.json'
# Bump whenever the rendered output changes, so stale stamps stop matching.
_FORMAT_VERSION = 1
_SPLITS = (('training', 'ADE_train'), ('validation', 'ADE_val'))
_MIN_OBJECT_SIZE = 18  # px; objects stay >= ~4 px wide at the decoder's 1/4 resolution
_MAX_OBJECT_SIZE = 0.55  # of the shorter image side
_MIN_VISIBLE = 0.5  # an occluded object keeps at least this share of its pixels
_PLACEMENT_TRIES = 30

Layer = Tuple[np.ndarray, np.ndarray]  # (mask HxW bool, rgb HxWx3 float)


def _brick(rng: np.random.Generator, grid: Grid) -> np.ndarray:
    """Wall texture: staggered brick courses separated by thin mortar lines."""
    yy, xx = grid
    course = rng.uniform(7, 11)
    brick_w = course * rng.uniform(2.0, 2.8)
    mortar_w = rng.uniform(1.2, 2.2)
    y = yy + rng.uniform(0, course)
    row = np.floor(y / course)
    x = xx + rng.uniform(0, brick_w) + (row % 2) * brick_w / 2
    col = np.floor(x / brick_w)
    mortar = ((y % course) < mortar_w) | ((x % brick_w) < mortar_w)
    # Per-brick shade jitter, as in real brickwork; small enough not to hide the mortar.
    shades = rng.uniform(-0.12, 0.12, (64, 64))
    shade = shades[row.astype(int) % 64, col.astype(int) % 64]
    brick_rgb, mortar_rgb = colour_pair(rng)
    bricks = brick_rgb * (1 + shade[..., None])
    return np.where(mortar[..., None], mortar_rgb, bricks)


def _planks(rng: np.random.Generator, grid: Grid) -> np.ndarray:
    """Floor texture: diagonal wooden planks with dark seams and wavy grain."""
    yy, xx = grid
    # Diagonal (30-60 degrees) so seams never line up with the wall's brick courses.
    angle = rng.choice([-1.0, 1.0]) * rng.uniform(np.pi / 6, np.pi / 3)
    u = xx * np.cos(angle) + yy * np.sin(angle) + rng.uniform(0, 50)
    v = -xx * np.sin(angle) + yy * np.cos(angle)
    plank_w = rng.uniform(9, 14)
    plank = np.floor(u / plank_w)
    seam = (u % plank_w) < 1.5
    grain = 0.5 + 0.5 * np.sin(u * rng.uniform(1.0, 1.6) + 2 * np.sin(v * 0.08 + plank * 1.7))
    wood_rgb, seam_rgb = colour_pair(rng)
    return mix(np.where(seam, 1.0, 0.3 * grain), wood_rgb, seam_rgb)


def _rect(rng: np.random.Generator, grid: Grid,
          min_side: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Random axis-aligned rectangle fully inside the image: (mask, local x, local y, w, h)."""
    yy, xx = grid
    height, width = yy.shape
    max_side = max(min_side, int(_MAX_OBJECT_SIZE * min(height, width)))
    w = int(rng.integers(min_side, max_side + 1))
    h = int(rng.integers(min_side, max_side + 1))
    lx = xx - rng.integers(0, width - w + 1)
    ly = yy - rng.integers(0, height - h + 1)
    mask = (lx >= 0) & (lx < w) & (ly >= 0) & (ly < h)
    return mask, lx, ly, w, h


def _frame(lx: np.ndarray, ly: np.ndarray, w: int, h: int, thickness: float) -> np.ndarray:
    """Border of a ``w x h`` rectangle given in local coordinates."""
    return (lx < thickness) | (lx >= w - thickness) | (ly < thickness) | (ly >= h - thickness)


def _windowpane(rng: np.random.Generator, grid: Grid) -> Layer:
    """Rectangle with a frame and a grid of bars over smooth, gradient-lit glass."""
    mask, lx, ly, w, h = _rect(rng, grid, min_side=24)
    bar_w = rng.uniform(2.0, 3.5)
    bars = _frame(lx, ly, w, h, rng.uniform(2.0, 4.0))
    # 2x2 or more panes, but keep each pane >= ~10 px so the bars stay a visible grid.
    cols = int(rng.integers(2, max(2, w // 12) + 1))
    rows = int(rng.integers(2, max(2, h // 12) + 1))
    for k in range(1, cols):
        bars |= np.abs(lx - k * w / cols) < bar_w / 2
    for k in range(1, rows):
        bars |= np.abs(ly - k * h / rows) < bar_w / 2
    frame_rgb, glass_rgb = colour_pair(rng)
    glass = mix(np.clip(ly / h, 0, 1), glass_rgb, glass_rgb * 0.6)
    glint = ((lx - 0.6 * ly + rng.uniform(0, w)) % (1.5 * w)) < 3
    glass = np.where(glint[..., None], glass + 0.35 * (255 - glass), glass)
    return mask, np.where(bars[..., None], frame_rgb, glass)


def _painting(rng: np.random.Generator, grid: Grid) -> Layer:
    """Rectangle with a plain frame around a fine checkerboard canvas."""
    mask, lx, ly, w, h = _rect(rng, grid, min_side=_MIN_OBJECT_SIZE)
    cell = rng.uniform(3.0, 6.0)
    ox, oy = rng.uniform(0, 1, 2)
    checker = (np.floor(lx / cell + ox) + np.floor(ly / cell + oy)) % 2
    light_rgb, dark_rgb = colour_pair(rng)
    canvas = mix(checker, light_rgb, dark_rgb)
    frame = _frame(lx, ly, w, h, rng.uniform(2.0, 4.0))
    return mask, np.where(frame[..., None], rng.uniform(0, 255, 3), canvas)


def _plant(rng: np.random.Generator, grid: Grid) -> Layer:
    """Irregular lobed blob sprinkled with small dots (leaves)."""
    yy, xx = grid
    height, width = yy.shape
    max_radius = max(_MIN_OBJECT_SIZE, _MAX_OBJECT_SIZE * min(height, width)) / 2
    radius = rng.uniform(_MIN_OBJECT_SIZE / 2, max_radius)
    # Lobes can reach 1.4x the radius, so keep the centre that far from the border.
    reach = min(1.4 * radius, min(height, width) / 2)
    cy = rng.uniform(reach, height - reach)
    cx = rng.uniform(reach, width - reach)
    dy, dx = yy - cy, xx - cx
    theta = np.arctan2(dy, dx)
    boundary = np.ones_like(theta)
    for lobes in (3, 5, 7):
        boundary += rng.uniform(0.08, 0.18) * np.sin(lobes * theta + rng.uniform(0, 2 * np.pi))
    mask = np.hypot(dx, dy) < radius * boundary
    seeds = rng.random(yy.shape) < 0.06
    dots = seeds.copy()
    # Grow each seed into a plus-shaped dot of ~5 px.
    dots[1:] |= seeds[:-1]
    dots[:-1] |= seeds[1:]
    dots[:, 1:] |= seeds[:, :-1]
    dots[:, :-1] |= seeds[:, 1:]
    leaf_rgb, dot_rgb = colour_pair(rng)
    return mask, np.where(dots[..., None], dot_rgb, leaf_rgb)


def _lamp(rng: np.random.Generator, grid: Grid) -> Layer:
    """Ellipse with concentric rings and a bright centre."""
    yy, xx = grid
    height, width = yy.shape
    max_axis = max(_MIN_OBJECT_SIZE, _MAX_OBJECT_SIZE * min(height, width)) / 2
    ax = rng.uniform(_MIN_OBJECT_SIZE / 2, max_axis)
    ay = np.clip(ax * rng.uniform(0.7, 1.4), _MIN_OBJECT_SIZE / 2, max_axis)
    cx = rng.uniform(ax, width - ax)
    cy = rng.uniform(ay, height - ay)
    rho = np.hypot((xx - cx) / ax, (yy - cy) / ay)
    mask = rho < 1
    period = rng.uniform(5.0, 8.0)
    phase = 2 * np.pi * rho * (ax + ay) / 2 / period + rng.uniform(0, 2 * np.pi)
    rings = (np.sin(phase) > 0).astype(float)
    ring_rgb, gap_rgb = colour_pair(rng)
    lit = mix(rings, ring_rgb, gap_rgb)
    glow = np.clip(1 - rho, 0, 1) * 0.4
    return mask, mix(glow, lit, np.full(3, 255.0))


_OBJECT_DRAWERS: Dict[str, Callable[[np.random.Generator, Grid], Layer]] = {
    'windowpane': _windowpane,
    'plant': _plant,
    'painting': _painting,
    'lamp': _lamp,
}


def _clutter(rng: np.random.Generator, grid: Grid) -> np.ndarray:
    """Thin strokes and small specks that the annotation leaves unlabelled (value 0)."""
    yy, xx = grid
    height, width = yy.shape
    clutter = np.zeros(yy.shape, dtype=bool)
    for _ in range(rng.integers(1, 4)):
        start = rng.uniform([0, 0], [width, height])
        length = rng.uniform(0.1, 0.3) * min(height, width)
        direction = rng.normal(size=2)
        seg = direction / np.linalg.norm(direction) * length
        # Distance from each pixel to the segment [start, start + seg].
        t = np.clip(((xx - start[0]) * seg[0] + (yy - start[1]) * seg[1]) / length ** 2, 0, 1)
        dist = np.hypot(xx - start[0] - t * seg[0], yy - start[1] - t * seg[1])
        clutter |= dist < rng.uniform(0.5, 1.0)
    for _ in range(rng.integers(2, 7)):
        cx, cy = rng.uniform([0, 0], [width, height])
        clutter |= np.hypot(xx - cx, yy - cy) < rng.uniform(1.0, 2.5)
    return clutter


def _render(rng: np.random.Generator, index: int, height: int,
            width: int) -> Tuple[np.ndarray, np.ndarray]:
    """One scene: (RGB uint8 image, ADE-convention uint8 label map)."""
    grid = tuple(np.mgrid[0:height, 0:width].astype(np.float32))
    yy, xx = grid
    horizon = height * rng.uniform(0.3, 0.7) + rng.uniform(2, 0.08 * height) * np.sin(
        2 * np.pi * xx / rng.uniform(0.5 * width, 1.5 * width) + rng.uniform(0, 2 * np.pi))
    is_wall = yy < horizon
    image = np.where(is_wall[..., None], _brick(rng, grid), _planks(rng, grid))
    label = np.where(is_wall, _LABEL_VALUE['wall'], _LABEL_VALUE['floor']).astype(np.uint8)

    # Two object classes are fixed by the index so that any two consecutive images
    # contain all four, which keeps every class in even a tiny validation split.
    first = (2 * index) % len(_OBJECT_CLASSES)
    names = [_OBJECT_CLASSES[first], _OBJECT_CLASSES[first + 1]]
    names += [str(n) for n in rng.choice(_OBJECT_CLASSES, size=int(rng.integers(0, 4)))]
    owner = np.full((height, width), -1, dtype=np.int64)
    areas: List[int] = []
    for name in names:
        for _ in range(_PLACEMENT_TRIES):
            mask, rgb = _OBJECT_DRAWERS[name](rng, grid)
            if keeps_others_visible(owner, mask, areas, _MIN_VISIBLE):
                break
        else:
            continue  # no placement leaves the earlier objects visible enough: skip this one
        owner[mask] = len(areas)
        areas.append(int(mask.sum()))
        image[mask] = rgb[mask]
        label[mask] = _LABEL_VALUE[name]

    clutter = _clutter(rng, grid)
    image[clutter] = rng.uniform(0, 255, 3)
    label[clutter] = 0

    # Smooth illumination gradient and sensor noise, so flat-colour shortcuts fail.
    slope_x, slope_y = rng.uniform(-0.25, 0.25, 2)
    light = 1 + slope_x * (xx / width - 0.5) + slope_y * (yy / height - 0.5)
    image = image * light[..., None] + rng.normal(0, rng.uniform(2, 6), image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), label


def _file_names(split_prefix: str, count: int) -> List[str]:
    return [f'{split_prefix}_{i:08d}' for i in range(count)]


def _remove_stale(directory: str, split_prefix: str, suffix: str, keep: int) -> None:
    """Delete files of an earlier, larger generation: mmseg would load every file it finds."""
    common.remove_stale(directory, [name + suffix for name in _file_names(split_prefix, keep)],
                        lambda name: name.startswith(split_prefix + '_') and name.endswith(suffix))


def generate_ade_like(root: str, num_train: int = 160, num_val: int = 40,
                      image_size: Tuple[int, int] = (160, 160), seed: int = 0,
                      progress: bool = True) -> dict:
    """Write a synthetic ADE20K-layout dataset under ``root`` (skipped if already there).

    Args:
        root: dataset root (the ``data_root`` of an mmseg ADE20K config).
        num_train: number of training images.
        num_val: number of validation images.
        image_size: (height, width) of every image.
        seed: base seed; each image uses its own generator seeded by (seed, split, index).
        progress: show a tqdm progress bar.

    Returns:
        dict with ``root``, ``num_train``, ``num_val``, ``classes`` (:data:`DEMO_CLASSES`)
        and ``class_pixel_fraction`` (share of labelled validation pixels per class).
    """
    height, width = common.validate_args(num_train, num_val, image_size, seed)
    root = os.fspath(root)
    counts = {'training': int(num_train), 'validation': int(num_val)}
    params = common.stamp_params(_FORMAT_VERSION, counts['training'], counts['validation'],
                                 height, width, int(seed))
    stamp_path = os.path.join(root, _STAMP_NAME)

    def summary(fractions: Dict[str, float]) -> dict:
        return {'root': root, 'num_train': params['num_train'], 'num_val': params['num_val'],
                'classes': DEMO_CLASSES, 'class_pixel_fraction': fractions}

    stamp = common.read_stamp(stamp_path)
    expected = [os.path.join(root, kind, split, name + suffix)
                for split, prefix in _SPLITS
                for name in _file_names(prefix, counts[split])
                for kind, suffix in (('images', '.jpg'), ('annotations', '.png'))]
    if common.stamp_is_current(stamp, params, expected, required_keys=('class_pixel_fraction',)):
        return summary(stamp['class_pixel_fraction'])

    val_pixels = np.zeros(len(DEMO_CLASSES), dtype=np.int64)
    with tqdm(total=sum(counts.values()), desc='synthetic ADE20K', disable=not progress) as bar:
        for split_code, (split, prefix) in enumerate(_SPLITS):
            image_dir = os.path.join(root, 'images', split)
            label_dir = os.path.join(root, 'annotations', split)
            for directory, suffix in ((image_dir, '.jpg'), (label_dir, '.png')):
                os.makedirs(directory, exist_ok=True)
                _remove_stale(directory, prefix, suffix, counts[split])
            for index, name in enumerate(_file_names(prefix, counts[split])):
                rng = np.random.default_rng([int(seed), split_code, index])
                image, label = _render(rng, index, height, width)
                Image.fromarray(image).save(os.path.join(image_dir, name + '.jpg'), quality=90)
                Image.fromarray(label).save(os.path.join(label_dir, name + '.png'))
                if split == 'validation':
                    val_pixels += [int((label == _LABEL_VALUE[c]).sum()) for c in DEMO_CLASSES]
                bar.update()

    fractions = {c: float(n) / float(val_pixels.sum()) for c, n in zip(DEMO_CLASSES, val_pixels)}
    common.write_stamp(stamp_path, {'params': params, 'class_pixel_fraction': fractions})
    return summary(fractions)


def majority_baseline_miou(class_pixel_fraction: Dict[str, float]) -> float:
    """mIoU (percent) of predicting the most frequent class everywhere.

    That class's IoU equals its pixel fraction and every other class scores 0,
    so the mean is ``max(fraction) / num_classes * 100``.
    """
    if not class_pixel_fraction:
        raise ValueError('class_pixel_fraction is empty')
    return max(class_pixel_fraction.values()) / len(class_pixel_fraction) * 100.0
