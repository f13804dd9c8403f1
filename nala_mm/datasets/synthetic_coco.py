"""Synthetic instance-segmentation data in exact COCO format.

A small stand-in for COCO so the detection demo (Mask R-CNN) can train on a
CPU in minutes. Each category is a distinct shape; colours and fill textures
are random and shared by all categories, so only the shape identifies one.

Layout (what mmdet's ``CocoDataset`` reads)::

    root/train2017/000000000001.jpg ...
    root/val2017/000000000001.jpg ...
    root/annotations/instances_{train,val}2017.json
"""
from __future__ import annotations

import json
import os
from typing import Callable, List, Tuple

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from . import synthetic_common as common
from .synthetic_common import Grid, colour_pair, keeps_others_visible, mix

COCO_DEMO_CLASSES: Tuple[str, ...] = ('disc', 'square', 'triangle', 'star')

_STAMP_NAME = '.synthetic_coco.json'
# Bump whenever the rendered output changes, so stale stamps stop matching.
_FORMAT_VERSION = 1
_SPLITS = ('train2017', 'val2017')
_MIN_RADIUS = 12.0  # px, circumradius; keeps the smallest object ~20 px across
_MAX_RADIUS = 0.22  # of the shorter image side
_MIN_VISIBLE = 0.6  # an occluded object keeps at least this share of its pixels
_PLACEMENT_TRIES = 50


def _stripes(rng: np.random.Generator, grid: Grid) -> np.ndarray:
    yy, xx = grid
    angle = rng.uniform(0, np.pi)
    u = xx * np.cos(angle) + yy * np.sin(angle)
    return ((u % rng.uniform(4, 10)) < 2).astype(float)


def _checker(rng: np.random.Generator, grid: Grid) -> np.ndarray:
    yy, xx = grid
    cell = rng.uniform(3, 7)
    return (np.floor(xx / cell) + np.floor(yy / cell)) % 2


def _dots(rng: np.random.Generator, grid: Grid) -> np.ndarray:
    yy, xx = grid
    pitch = rng.uniform(5, 9)
    return (np.hypot((xx % pitch) - pitch / 2, (yy % pitch) - pitch / 2) < pitch / 4).astype(float)


def _gradient(rng: np.random.Generator, grid: Grid) -> np.ndarray:
    yy, xx = grid
    angle = rng.uniform(0, 2 * np.pi)
    u = xx * np.cos(angle) + yy * np.sin(angle)
    return (u - u.min()) / max(float(np.ptp(u)), 1.0)


# Fill patterns are drawn independently of the category: only shape is informative.
_FILLS: Tuple[Callable[[np.random.Generator, Grid], np.ndarray], ...] = (
    _stripes, _checker, _dots, _gradient)


def _shape_polygon(rng: np.random.Generator, category: str, height: int, width: int) -> np.ndarray:
    """Vertices (N x 2, x/y) of one randomly placed, rotated shape fully inside the image."""
    radius = rng.uniform(_MIN_RADIUS, max(_MIN_RADIUS, _MAX_RADIUS * min(height, width)))
    rotation = rng.uniform(0, 2 * np.pi)
    if category == 'disc':
        # A mildly elliptic disc, approximated by 32 vertices.
        angles = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        axes = radius * np.array([1.0, rng.uniform(0.75, 1.0)])
        points = np.stack([np.cos(angles), np.sin(angles)], axis=1) * axes
    else:
        corners = {'square': 4, 'triangle': 3, 'star': 10}[category]
        angles = np.linspace(0, 2 * np.pi, corners, endpoint=False)
        radii = np.full(corners, radius)
        if category == 'star':
            radii[1::2] *= 0.45  # inner vertices of a five-pointed star
        points = np.stack([np.cos(angles), np.sin(angles)], axis=1) * radii[:, None]
    cos, sin = np.cos(rotation), np.sin(rotation)
    points = points @ np.array([[cos, sin], [-sin, cos]])
    # Keep a 1 px margin so every vertex, hence every bbox, lies inside the image.
    low = 1 - points.min(axis=0)
    high = np.array([width - 1, height - 1]) - points.max(axis=0)
    return points + rng.uniform(low, np.maximum(low, high))


def _rasterize(polygon: np.ndarray, height: int, width: int) -> np.ndarray:
    """Pixel mask of a polygon in COCO coordinates (pixel (i, j) covers [j, j+1] x [i, i+1])."""
    canvas = Image.new('L', (width, height), 0)
    # PIL puts pixel centres on integers, COCO on half-integers.
    ImageDraw.Draw(canvas).polygon([tuple(p) for p in polygon - 0.5], fill=1)
    return np.asarray(canvas, dtype=bool)


def _render(rng: np.random.Generator, height: int,
            width: int) -> Tuple[np.ndarray, List[Tuple[int, np.ndarray]]]:
    """One image and its objects as (category index, polygon) in drawing order."""
    grid = tuple(np.mgrid[0:height, 0:width].astype(np.float32))
    yy, xx = grid
    # Background: soft two-colour blotches, kept low-contrast next to the object fills.
    blotch = 0.5 + 0.5 * np.sin(xx * rng.uniform(0.03, 0.1) + rng.uniform(0, 6)) * np.sin(
        yy * rng.uniform(0.03, 0.1) + rng.uniform(0, 6))
    first, second = colour_pair(rng)
    image = mix(0.5 * blotch, first, second)

    owner = np.full((height, width), -1, dtype=np.int64)
    areas: List[int] = []
    objects: List[Tuple[int, np.ndarray]] = []
    for _ in range(int(rng.integers(2, 6))):
        category = int(rng.integers(len(COCO_DEMO_CLASSES)))
        for _ in range(_PLACEMENT_TRIES):
            polygon = _shape_polygon(rng, COCO_DEMO_CLASSES[category], height, width)
            mask = _rasterize(polygon, height, width)
            if mask.any() and keeps_others_visible(owner, mask, areas, _MIN_VISIBLE):
                break
        else:
            continue  # no placement leaves the earlier objects visible enough: skip this one
        owner[mask] = len(areas)
        areas.append(int(mask.sum()))
        objects.append((category, polygon))
        fill = _FILLS[int(rng.integers(len(_FILLS)))](rng, grid)
        image[mask] = mix(fill, *colour_pair(rng))[mask]

    image = image + rng.normal(0, rng.uniform(2, 5), image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), objects


def _annotation(ann_id: int, image_id: int, category: int, polygon: np.ndarray) -> dict:
    """COCO annotation of one polygon (coordinates rounded to 0.01 px)."""
    points = np.round(polygon, 2)
    x, y = points[:, 0], points[:, 1]
    area = 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))  # shoelace
    x0, y0 = float(x.min()), float(y.min())
    return {'id': ann_id, 'image_id': image_id, 'category_id': category + 1,
            'segmentation': [[float(v) for v in points.ravel()]],
            'area': round(area, 2),
            'bbox': [x0, y0, round(float(x.max()) - x0, 2), round(float(y.max()) - y0, 2)],
            'iscrowd': 0}


def _file_names(count: int) -> List[str]:
    return [f'{image_id:012d}.jpg' for image_id in range(1, count + 1)]


def _remove_stale(directory: str, keep: int) -> None:
    """Delete images of an earlier, larger generation so the folder matches the JSON."""
    common.remove_stale(directory, _file_names(keep),
                        lambda name: name.endswith('.jpg') and len(name) == 16
                        and name[:12].isdigit())


def generate_coco_like(root: str, num_train: int = 120, num_val: int = 30,
                       image_size: Tuple[int, int] = (192, 192), seed: int = 0,
                       progress: bool = True) -> dict:
    """Write a synthetic COCO-format instance dataset under ``root`` (skipped if already there).

    Args:
        root: dataset root (the ``data_root`` of an mmdet COCO config).
        num_train: number of training images.
        num_val: number of validation images.
        image_size: (height, width) of every image.
        seed: base seed; each image uses its own generator seeded by (seed, split, index).
        progress: show a tqdm progress bar.

    Returns:
        dict with ``root``, ``num_train``, ``num_val`` and ``classes`` (:data:`COCO_DEMO_CLASSES`).
    """
    height, width = common.validate_args(num_train, num_val, image_size, seed)
    root = os.fspath(root)
    counts = {'train2017': int(num_train), 'val2017': int(num_val)}
    params = common.stamp_params(_FORMAT_VERSION, counts['train2017'], counts['val2017'],
                                 height, width, int(seed))
    summary = {'root': root, 'num_train': params['num_train'], 'num_val': params['num_val'],
               'classes': COCO_DEMO_CLASSES}
    stamp_path = os.path.join(root, _STAMP_NAME)
    ann_dir = os.path.join(root, 'annotations')
    expected = [os.path.join(ann_dir, f'instances_{split}.json') for split in _SPLITS]
    expected += [os.path.join(root, split, name)
                 for split in _SPLITS for name in _file_names(counts[split])]
    if common.stamp_is_current(common.read_stamp(stamp_path), params, expected):
        return summary

    categories = [{'id': i + 1, 'name': name, 'supercategory': 'shape'}
                  for i, name in enumerate(COCO_DEMO_CLASSES)]
    os.makedirs(ann_dir, exist_ok=True)
    with tqdm(total=sum(counts.values()), desc='synthetic COCO', disable=not progress) as bar:
        for split_code, split in enumerate(_SPLITS):
            image_dir = os.path.join(root, split)
            os.makedirs(image_dir, exist_ok=True)
            _remove_stale(image_dir, counts[split])
            images: List[dict] = []
            annotations: List[dict] = []
            for index, file_name in enumerate(_file_names(counts[split])):
                image_id = index + 1
                rng = np.random.default_rng([int(seed), split_code, index])
                image, objects = _render(rng, height, width)
                Image.fromarray(image).save(os.path.join(image_dir, file_name), quality=90)
                images.append({'id': image_id, 'file_name': file_name,
                               'width': width, 'height': height})
                for category, polygon in objects:
                    ann_id = len(annotations) + 1
                    annotations.append(_annotation(ann_id, image_id, category, polygon))
                bar.update()
            info = {'description': 'nala_mm synthetic shapes', 'version': str(_FORMAT_VERSION)}
            dataset = {'info': info, 'licenses': [], 'images': images, 'annotations': annotations,
                       'categories': categories}
            with open(os.path.join(ann_dir, f'instances_{split}.json'), 'w', encoding='utf-8') as f:
                json.dump(dataset, f)

    common.write_stamp(stamp_path, {'params': params})
    return summary
