"""A segmentation task whose labels are set by content far away: the long-range exemplar task.

Every image holds look-alike objects (discs and squares) in two flat, saturated colours drawn
from a small palette, and, along a random edge, an *exemplar*: a band of one of the two colours
in a white frame. An object whose colour matches the exemplar's is class ``windowpane``
("matches"), an object of the other colour class ``painting`` ("differs"). Both colours, and
which of them the exemplar shows, are drawn afresh for every image, and each object takes either
with equal chance, so every local statistic is symmetric between the classes: an object's own
pixels, and its neighbours, say nothing about its class, and only a model that compares the
object with the distant exemplar can label it (this project's README).

Distances are chosen against the receptive field of the convolutions: every object stays at
least :data:`FAR_PX` pixels (Chebyshev) away from the exemplar, more than the reach of the
convolutions on every path to a pixel's logits in the long-range config (this project's
``configs/``), so the control mixer that mixes no tokens cannot see the exemplar from an object
at all.

Layout (what mmseg's ``ADE20KDataset`` reads), as :mod:`nala_mm.datasets.synthetic_ade`::

    root/images/{training,validation}/ADE_{train,val}_00000000.jpg
    root/annotations/{training,validation}/ADE_{train,val}_00000000.png

Label PNGs follow ADE20K: value ``ADE index + 1`` of :data:`LONGRANGE_CLASSES`; the exemplar is 0
(unlabelled, ignored after ``reduce_zero_label``): it is the key, not something to segment.

    python -m projects.longrange.data [--root DIR] [--num-train N] [--num-val N] [--seed S]
                                      [--exemplar-px PX]
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import os
from statistics import mean
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from tqdm import tqdm

from nala_mm.datasets import synthetic_common as common
from nala_mm.datasets.synthetic_ade import ADE_CLASS_NAMES

DEFAULT_ROOT = 'data/longrange/ade/ADEChallengeData2016'
DEFAULT_SIZE = (128, 128)
# Background first, then "matches the exemplar" and "differs from it" (ADE order, so a metainfo
# subset keeps this order and mmseg's label_map sends them to 0, 1, 2).
BACKGROUND_CLASS, MATCH_CLASS, OTHER_CLASS = 'wall', 'windowpane', 'painting'
OBJECT_CLASSES: Tuple[str, ...] = (MATCH_CLASS, OTHER_CLASS)
LONGRANGE_CLASSES: Tuple[str, ...] = (BACKGROUND_CLASS,) + OBJECT_CLASSES
LABEL_VALUE: Dict[str, int] = {name: ADE_CLASS_NAMES.index(name) + 1
                               for name in LONGRANGE_CLASSES}
EXEMPLAR_VALUE = 0  # unlabelled

# Saturated, well-separated colours; objects and the exemplar take them, the background is grey.
PALETTE = np.array([(220, 40, 40), (40, 190, 60), (50, 80, 230), (230, 210, 40),
                    (210, 50, 200), (40, 200, 210)], dtype=np.float64)
COLOUR_JITTER = 12.0  # per image and colour, shared by the exemplar and the objects
EXEMPLAR_PX = 32  # thickness of the exemplar band: a FRAME_PX white frame around the colour
FRAME_PX = 4
# the thinnest band that still shows its colour (graded.py thins it)
MIN_EXEMPLAR_PX = 2 * FRAME_PX + 1
FRAME_GREY = 245.0
EDGE_MARGIN_PX = (2, 8)  # exemplar distance from the image edges, drawn uniformly
# In the long-range config the convolutions on every path to a pixel's logits (the stem, the
# stage-1 block, the decoder's upsampling) reach 32 px, measured by gradients
# (benchmarks/lib/receptive_field.py; the long-range study records it): an object this far
# from the exemplar is out of their sight.
FAR_PX = 36
OBJECT_RADIUS_PX = (6, 11)
OBJECTS_PER_IMAGE = (6, 10)
OBJECT_GAP_PX = 3
PLACEMENT_TRIES = 200
PIXEL_NOISE = 3.0
BACKGROUND_TEXTURE = 4.0  # std of the background's coarse blotches, per channel
MIN_SIZE = 3 * FAR_PX  # below this few objects fit far enough from the exemplar

_STAMP_NAME = '.longrange.json'
# Bump whenever the rendered output changes, so stale stamps stop matching.
_FORMAT_VERSION = 1
_SPLITS = (('training', 'ADE_train'), ('validation', 'ADE_val'))  # split codes 0, 1
JPEG_QUALITY = 95

Box = Tuple[int, int, int, int]  # y0, x0, y1, x1 (exclusive ends)


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One look-alike object: ``shape`` 'disc' or 'square', centre, radius (half side), its
    palette colour and a brightness factor."""
    shape: str
    cy: int
    cx: int
    radius: int
    colour: int
    brightness: float

    @property
    def box(self) -> Box:
        r = self.radius
        return self.cy - r, self.cx - r, self.cy + r + 1, self.cx + r + 1


@dataclasses.dataclass(frozen=True)
class Scene:
    """Everything an image is rendered from (:func:`render`).

    ``colours`` is this image's jittered palette, ``exemplar`` the palette index of the
    exemplar's colour (one of the two the objects take) and ``exemplar_box`` the band's box;
    ``noise_seed`` fixes the background texture and the pixel noise over the whole image,
    independently of everything else, so two scenes that differ only in ``exemplar`` render
    identical pixels outside it.
    """
    height: int
    width: int
    colours: Tuple[Tuple[float, float, float], ...]
    exemplar: int
    exemplar_box: Box
    objects: Tuple[SceneObject, ...]
    background: Tuple[float, float, float]
    noise_seed: int

    def object_class(self, obj: SceneObject) -> str:
        """The rule: an object matching the exemplar's colour is :data:`MATCH_CLASS`."""
        return MATCH_CLASS if obj.colour == self.exemplar else OTHER_CLASS


def box_distance(a: Box, b: Box) -> int:
    """Chebyshev distance in pixels between two boxes' nearest pixels (0 when they overlap)."""
    dy = max(a[0] - b[2] + 1, b[0] - a[2] + 1, 0)
    dx = max(a[1] - b[3] + 1, b[1] - a[3] + 1, 0)
    return max(dy, dx)


def exemplar_band(edge: int, height: int, width: int, margin: int, inset: int,
                  thickness: int = EXEMPLAR_PX) -> Box:
    """The band's box along ``edge`` (0 top, 1 bottom, 2 left, 3 right), ``margin`` px from
    that edge, ``inset`` px short of the two corners it spans and ``thickness`` px deep."""
    if edge == 0:
        return margin, inset, margin + thickness, width - inset
    if edge == 1:
        return height - margin - thickness, inset, height - margin, width - inset
    if edge == 2:
        return inset, margin, height - inset, margin + thickness
    return inset, width - margin - thickness, height - inset, width - margin


def sample_scene(rng: np.random.Generator, height: int, width: int,
                 exemplar_px: int = EXEMPLAR_PX) -> Scene:
    """Draw one scene: the exemplar's colour and edge, the objects and their colours, with a
    band ``exemplar_px`` thick. The thickness draws nothing: one generator gives every thickness
    the same colours and the same band position; the objects, placed after, differ, since more
    of them fit beside a thinner band."""
    if exemplar_px < MIN_EXEMPLAR_PX:
        raise ValueError(f'exemplar_px must be at least {MIN_EXEMPLAR_PX} (a {FRAME_PX} px frame '
                         f'on both sides of the colour), got {exemplar_px!r}')
    if min(height, width) < MIN_SIZE:
        raise ValueError(f'the long-range task needs images of at least {MIN_SIZE} px a side '
                         f'(objects stay {FAR_PX} px from the exemplar), got {height}x{width}')
    count = len(PALETTE)
    colours = np.clip(PALETTE + rng.uniform(-COLOUR_JITTER, COLOUR_JITTER, (count, 3)), 0, 255)
    exemplar, other = (int(c) for c in rng.choice(count, size=2, replace=False))
    box = exemplar_band(int(rng.integers(0, 4)), height, width,
                        *(int(m) for m in rng.integers(EDGE_MARGIN_PX[0], EDGE_MARGIN_PX[1] + 1,
                                                       size=2)), thickness=exemplar_px)

    n_objects = int(rng.integers(OBJECTS_PER_IMAGE[0], OBJECTS_PER_IMAGE[1] + 1))
    # the first two objects: one of each colour, so every image shows both classes
    matches = [True, False] + [bool(m) for m in rng.random(n_objects - 2) < 0.5]
    objects: List[SceneObject] = []
    for match in matches:
        colour = exemplar if match else other
        for _ in range(PLACEMENT_TRIES):
            radius = int(rng.integers(OBJECT_RADIUS_PX[0], OBJECT_RADIUS_PX[1] + 1))
            candidate = SceneObject(
                shape='disc' if rng.random() < 0.5 else 'square',
                cy=int(rng.integers(radius, height - radius)),
                cx=int(rng.integers(radius, width - radius)),
                radius=radius, colour=colour, brightness=float(rng.uniform(0.9, 1.1)))
            if box_distance(candidate.box, box) >= FAR_PX and all(
                    box_distance(candidate.box, other.box) > OBJECT_GAP_PX for other in objects):
                objects.append(candidate)
                break
    background = tuple(float(v) for v in rng.uniform(90, 160) + rng.uniform(-6, 6, 3))
    return Scene(height=height, width=width,
                 colours=tuple(tuple(float(v) for v in c) for c in colours), exemplar=exemplar,
                 exemplar_box=box, objects=tuple(objects), background=background,
                 noise_seed=int(rng.integers(0, 2 ** 31)))


def _object_mask(obj: SceneObject, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    if obj.shape == 'disc':
        return (yy - obj.cy) ** 2 + (xx - obj.cx) ** 2 <= obj.radius ** 2
    return (np.abs(yy - obj.cy) <= obj.radius) & (np.abs(xx - obj.cx) <= obj.radius)


def render(scene: Scene) -> Tuple[np.ndarray, np.ndarray]:
    """The scene as (RGB uint8 image, ADE-convention uint8 label map)."""
    height, width = scene.height, scene.width
    noise = np.random.default_rng(scene.noise_seed)
    # a faint background texture (coarse blotches) and pixel noise, both over the whole image
    # and drawn first, so they do not depend on the objects or the exemplar
    coarse = noise.normal(0, BACKGROUND_TEXTURE, (height // 16 + 2, width // 16 + 2, 3))
    texture = np.kron(coarse, np.ones((16, 16, 1)))[:height, :width]
    pixel_noise = noise.normal(0, PIXEL_NOISE, (height, width, 3))
    yy, xx = np.mgrid[0:height, 0:width]

    image = np.asarray(scene.background) + texture
    label = np.full((height, width), LABEL_VALUE[BACKGROUND_CLASS], dtype=np.uint8)
    for obj in scene.objects:
        mask = _object_mask(obj, yy, xx)
        image[mask] = np.asarray(scene.colours[obj.colour]) * obj.brightness
        label[mask] = LABEL_VALUE[scene.object_class(obj)]

    y0, x0, y1, x1 = scene.exemplar_box
    image[y0:y1, x0:x1] = FRAME_GREY
    image[y0 + FRAME_PX:y1 - FRAME_PX, x0 + FRAME_PX:x1 - FRAME_PX] = scene.colours[scene.exemplar]
    label[y0:y1, x0:x1] = EXEMPLAR_VALUE
    image = image + pixel_noise
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), label


def _file_names(split_prefix: str, count: int) -> List[str]:
    return [f'{split_prefix}_{i:08d}' for i in range(count)]


def scene_rng(seed: int, split_code: int, index: int) -> np.random.Generator:
    """The generator of one image: seeded by (seed, split, index), so any image can be redrawn
    alone and the data do not depend on how many images are asked for."""
    return np.random.default_rng([int(seed), split_code, index])


def generate_longrange(root: str = DEFAULT_ROOT, num_train: int = 1000, num_val: int = 100,
                       image_size: Tuple[int, int] = DEFAULT_SIZE, seed: int = 0,
                       progress: bool = True, exemplar_px: int = EXEMPLAR_PX) -> dict:
    """Write the long-range exemplar dataset under ``root`` in the ADE20K layout (skipped when an
    earlier run with the same arguments finished and its files are there).

    Returns ``root``, ``num_train``, ``num_val``, ``classes`` (:data:`LONGRANGE_CLASSES`) and
    ``class_pixel_fraction`` (share of labelled validation pixels per class).
    """
    height, width = common.validate_args(num_train, num_val, image_size, seed)
    if min(height, width) < MIN_SIZE:
        raise ValueError(f'image_size must be at least {MIN_SIZE} px a side (objects stay '
                         f'{FAR_PX} px from the exemplar), got {tuple(image_size)!r}')
    root = os.fspath(root)
    counts = {'training': int(num_train), 'validation': int(num_val)}
    params = common.stamp_params(_FORMAT_VERSION, counts['training'], counts['validation'], height,
                                 width, int(seed))
    if exemplar_px != EXEMPLAR_PX:  # the default leaves existing stamps current
        params['exemplar_px'] = int(exemplar_px)
    stamp_path = os.path.join(root, _STAMP_NAME)

    def summary(fractions: Dict[str, float]) -> dict:
        return {'root': root, 'num_train': counts['training'], 'num_val': counts['validation'],
                'classes': LONGRANGE_CLASSES, 'class_pixel_fraction': fractions}

    expected = [os.path.join(root, kind, split, name + suffix)
                for split, prefix in _SPLITS
                for name in _file_names(prefix, counts[split])
                for kind, suffix in (('images', '.jpg'), ('annotations', '.png'))]
    stamp = common.read_stamp(stamp_path)
    if common.stamp_is_current(stamp, params, expected, required_keys=('class_pixel_fraction',)):
        return summary(stamp['class_pixel_fraction'])

    val_pixels = np.zeros(len(LONGRANGE_CLASSES), dtype=np.int64)
    with tqdm(total=sum(counts.values()), desc='long-range exemplar data',
              disable=not progress) as bar:
        for split_code, (split, prefix) in enumerate(_SPLITS):
            image_dir = os.path.join(root, 'images', split)
            label_dir = os.path.join(root, 'annotations', split)
            for directory, suffix in ((image_dir, '.jpg'), (label_dir, '.png')):
                os.makedirs(directory, exist_ok=True)
                # mmseg loads every file it finds: drop those of an earlier, larger run
                wanted = [n + suffix for n in _file_names(prefix, counts[split])]
                common.remove_stale(directory, wanted,
                                    lambda n, p=prefix, s=suffix: n.startswith(p + '_')
                                    and n.endswith(s))
            for index, name in enumerate(_file_names(prefix, counts[split])):
                image, label = render(sample_scene(scene_rng(seed, split_code, index), height,
                                                   width, exemplar_px))
                Image.fromarray(image).save(os.path.join(image_dir, name + '.jpg'),
                                            quality=JPEG_QUALITY)
                Image.fromarray(label).save(os.path.join(label_dir, name + '.png'))
                if split == 'validation':
                    val_pixels += [int((label == LABEL_VALUE[c]).sum())
                                   for c in LONGRANGE_CLASSES]
                bar.update()

    fractions = {c: float(n) / float(val_pixels.sum())
                 for c, n in zip(LONGRANGE_CLASSES, val_pixels)}
    common.write_stamp(stamp_path, {'params': params, 'class_pixel_fraction': fractions})
    return summary(fractions)


def validation_image(index: int, seed: int = 0, image_size: Tuple[int, int] = DEFAULT_SIZE,
                     exemplar_px: int = EXEMPLAR_PX) -> np.ndarray:
    """The pixels mmseg loads from validation image ``index`` of :func:`generate_longrange` with
    these arguments, drawn again (:func:`scene_rng`) and through the same JPEG encoding, without
    the data on disk: the study's report pictures one (``--report-only`` needs no data)."""
    height, width = image_size
    image, _ = render(sample_scene(scene_rng(seed, 1, index), height, width, exemplar_px))
    encoded = io.BytesIO()
    Image.fromarray(image).save(encoded, format='JPEG', quality=JPEG_QUALITY)
    return np.asarray(Image.open(encoded))


def local_chance_miou(class_pixel_fraction: Dict[str, float]) -> float:
    """mIoU (percent) of a model that finds the objects exactly but guesses their class (the
    best any model blind to the exemplar can do in expectation: every class is equally likely
    for every object): background IoU 1, each object class ``(f_c / k) / (f_c + F / k - f_c / k)``
    with ``f_c`` its pixel share, ``F`` the objects' total share and ``k`` the number of object
    classes, when guesses are uniform. Assumes the background is the first class."""
    fractions = list(class_pixel_fraction.values())
    if len(fractions) < 2:
        raise ValueError(f'need a background and object classes, got {class_pixel_fraction!r}')
    objects = fractions[1:]
    k, total = len(objects), sum(objects)
    ious = [1.0] + [(f / k) / (f + total / k - f / k) for f in objects]
    return 100.0 * sum(ious) / len(ious)


def exemplar_mass(scene: Scene, maps: Sequence[np.ndarray], grid: Tuple[int, int]
                  ) -> Dict[str, Optional[float]]:
    """Where the attention rows of a scene's objects land: ``maps`` holds one row per object
    of ``scene.objects`` (the weights at each object's centre on a layer's ``grid`` of tokens,
    e.g. RoPE on and the mean over heads). Returns the share of each row's absolute weight that
    lands on the exemplar's tokens, averaged over the objects that match the exemplar and over
    those that do not (``None`` without such objects), and the exemplar's share of the tokens
    (what a uniform row puts there). A mixer that compares an object with the exemplar looks
    there harder for one kind."""
    rows, cols = grid
    y0, x0, y1, x1 = scene.exemplar_box
    ty = (np.arange(rows) + 0.5) * scene.height / rows
    tx = (np.arange(cols) + 0.5) * scene.width / cols
    inside = ((ty >= y0) & (ty < y1))[:, None] & ((tx >= x0) & (tx < x1))[None, :]
    shares: Dict[bool, List[float]] = {True: [], False: []}
    for obj, weights in zip(scene.objects, maps):
        magnitude = np.abs(weights)
        total = magnitude.sum()
        shares[scene.object_class(obj) == MATCH_CLASS].append(
            float(magnitude[inside].sum() / total) if total > 0 else 0.0)
    return dict(exemplar_mass_match=mean(shares[True]) if shares[True] else None,
                exemplar_mass_other=mean(shares[False]) if shares[False] else None,
                exemplar_token_share=float(inside.mean()))


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--root', default=DEFAULT_ROOT)
    parser.add_argument('--num-train', type=int, default=1000)
    parser.add_argument('--num-val', type=int, default=100)
    parser.add_argument('--size', type=int, nargs=2, default=DEFAULT_SIZE, metavar=('H', 'W'))
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--exemplar-px', type=int, default=EXEMPLAR_PX,
                        help='the exemplar band\'s thickness, its white frame included')
    args = parser.parse_args(argv)
    result = generate_longrange(args.root, args.num_train, args.num_val, tuple(args.size),
                                args.seed, exemplar_px=args.exemplar_px)
    shares = ', '.join(f'{k} {v:.3f}' for k, v in result['class_pixel_fraction'].items())
    print(f"{result['num_train']} training and {result['num_val']} validation images in "
          f"{result['root']}; validation pixel shares: {shares}")


if __name__ == '__main__':
    main()
