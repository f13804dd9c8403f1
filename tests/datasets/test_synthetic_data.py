"""Synthetic ADE20K-layout and COCO-format generators: layout, labels, determinism, caching."""
import importlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

from tests.helpers import REPO


def _load(name: str) -> ModuleType:
    """Import a generator module; they need only numpy/PIL/tqdm, not the mm stack."""
    try:
        return importlib.import_module(f'nala_mm.datasets.{name}')
    except ImportError:  # nala_mm/__init__ pulls in mmengine, absent in a bare env
        # A stand-in package over nala_mm/datasets that skips its __init__, so the generators'
        # relative import of synthetic_common still resolves.
        if '_nala_mm_datasets' not in sys.modules:
            package = ModuleType('_nala_mm_datasets')
            package.__path__ = [str(REPO / 'nala_mm' / 'datasets')]
            sys.modules['_nala_mm_datasets'] = package
        return importlib.import_module(f'_nala_mm_datasets.{name}')


ade = _load('synthetic_ade')
coco = _load('synthetic_coco')

ADE_ARGS = dict(num_train=4, num_val=2, image_size=(64, 80), seed=3, progress=False)
COCO_ARGS = dict(num_train=3, num_val=2, image_size=(72, 96), seed=5, progress=False)


def _files(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob('*')) if p.is_file()}


@pytest.fixture(scope='module')
def ade_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp('ade')
    ade.generate_ade_like(str(root), **ADE_ARGS)
    return root


@pytest.fixture(scope='module')
def coco_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp('coco')
    coco.generate_coco_like(str(root), **COCO_ARGS)
    return root


def _ade_pairs(root: Path, split: str, prefix: str, count: int):
    for i in range(count):
        image = np.asarray(Image.open(root / 'images' / split / f'{prefix}_{i:08d}.jpg'))
        label_img = Image.open(root / 'annotations' / split / f'{prefix}_{i:08d}.png')
        assert label_img.mode == 'L'
        yield image, np.asarray(label_img)


def test_demo_classes_are_ade20k_classes_in_its_order():
    names = ade.ADE_CLASS_NAMES
    assert len(ade.DEMO_CLASSES) == 6 and set(ade.DEMO_CLASSES) <= set(names)
    assert sorted(ade.DEMO_CLASSES, key=names.index) == list(ade.DEMO_CLASSES)


def test_ade_layout_labels_and_images(ade_root):
    files = _files(ade_root)
    expected = {f'images/training/ADE_train_{i:08d}.jpg' for i in range(4)}
    expected |= {f'annotations/training/ADE_train_{i:08d}.png' for i in range(4)}
    expected |= {f'images/validation/ADE_val_{i:08d}.jpg' for i in range(2)}
    expected |= {f'annotations/validation/ADE_val_{i:08d}.png' for i in range(2)}
    assert set(files) == expected | {'.synthetic_ade.json'}

    allowed = {0} | {ade.ADE_CLASS_NAMES.index(c) + 1 for c in ade.DEMO_CLASSES}
    assert allowed == {0, 1, 4, 9, 18, 23, 37}  # the real ADE indices, +1
    ignored = total = 0
    for split, prefix, count in (('training', 'ADE_train', 4), ('validation', 'ADE_val', 2)):
        for image, label in _ade_pairs(ade_root, split, prefix, count):
            assert image.shape == (64, 80, 3) and image.dtype == np.uint8
            assert label.shape == (64, 80) and label.dtype == np.uint8
            assert set(np.unique(label)) <= allowed
            ignored += int((label == 0).sum())
            total += label.size
    assert 0 < ignored < 0.10 * total

    val_values = set()
    for _, label in _ade_pairs(ade_root, 'validation', 'ADE_val', 2):
        val_values |= set(np.unique(label).tolist())
    assert val_values == allowed  # every demo class (and some ignore) in a 2-image val split


def test_ade_colour_does_not_identify_class(ade_root):
    """Per image, the mean colour of a class varies widely: only texture/shape are stable."""
    means = {}
    for split, prefix, count in (('training', 'ADE_train', 4), ('validation', 'ADE_val', 2)):
        for image, label in _ade_pairs(ade_root, split, prefix, count):
            for value in np.unique(label[label > 0]):
                if (label == value).sum() >= 100:
                    means.setdefault(int(value), []).append(image[label == value].mean(axis=0))
    assert len(means) == 6
    for value, per_image in means.items():
        assert len(per_image) >= 2, value
        assert np.std(np.asarray(per_image), axis=0).mean() > 20, value


def test_ade_summary_and_baseline(ade_root):
    summary = ade.generate_ade_like(str(ade_root), **ADE_ARGS)
    fractions = summary['class_pixel_fraction']
    assert summary['classes'] == ade.DEMO_CLASSES == tuple(fractions)
    assert (summary['num_train'], summary['num_val']) == (4, 2)
    assert sum(fractions.values()) == pytest.approx(1.0)

    counts = dict.fromkeys(ade.DEMO_CLASSES, 0)
    for _, label in _ade_pairs(ade_root, 'validation', 'ADE_val', 2):
        for name in ade.DEMO_CLASSES:
            counts[name] += int((label == ade.ADE_CLASS_NAMES.index(name) + 1).sum())
    labelled = sum(counts.values())
    assert fractions == pytest.approx({k: v / labelled for k, v in counts.items()})

    baseline = ade.majority_baseline_miou({'wall': 0.5, 'floor': 0.3, 'lamp': 0.2})
    assert baseline == pytest.approx(50 / 3)
    assert ade.majority_baseline_miou({'a': 1.0}) == pytest.approx(100.0)
    with pytest.raises(ValueError):
        ade.majority_baseline_miou({})


def test_ade_deterministic_idempotent_and_prunes(ade_root, tmp_path):
    files = _files(ade_root)
    mtimes = {name: path.stat().st_mtime_ns for name, path in files.items()}
    ade.generate_ade_like(str(ade_root), **ADE_ARGS)
    assert {name: path.stat().st_mtime_ns for name, path in _files(ade_root).items()} == mtimes

    copy = tmp_path / 'copy'
    ade.generate_ade_like(str(copy), **ADE_ARGS)
    copy_files = _files(copy)
    assert set(copy_files) == set(files)
    for name, path in files.items():
        assert path.read_bytes() == copy_files[name].read_bytes(), name

    # Fewer images, other seed: regenerated, and the extra files of the first run are gone.
    ade.generate_ade_like(str(copy), **{**ADE_ARGS, 'num_train': 2, 'num_val': 1, 'seed': 4})
    assert len(_files(copy)) == 2 * (2 + 1) + 1
    first = 'images/training/ADE_train_00000000.jpg'
    assert (copy / first).read_bytes() != files[first].read_bytes()


@pytest.mark.parametrize('generate', ['ade', 'coco'])
@pytest.mark.parametrize('kwargs, bad', [
    (dict(num_train=0), 'num_train.*got 0'), (dict(num_val=-2), 'num_val.*got -2'),
    (dict(image_size=(64, 31)), 'image_size.*got 31'),
    (dict(image_size=(16, 64)), 'image_size.*got 16'),
    (dict(seed=-1), 'seed.*got -1'),
])
def test_bad_arguments_raise(generate, kwargs, bad, tmp_path):
    fn = ade.generate_ade_like if generate == 'ade' else coco.generate_coco_like
    with pytest.raises(ValueError, match=bad):
        fn(str(tmp_path), **{'progress': False, **kwargs})
    assert not any(tmp_path.iterdir())  # nothing written before validation


def _coco_json(root: Path, split: str) -> dict:
    return json.loads((root / 'annotations' / f'instances_{split}.json').read_text())


def test_coco_layout_and_annotations(coco_root):
    height, width = COCO_ARGS['image_size']
    for split, count in (('train2017', 3), ('val2017', 2)):
        data = _coco_json(coco_root, split)
        assert [c['id'] for c in data['categories']] == [1, 2, 3, 4]
        assert tuple(c['name'] for c in data['categories']) == coco.COCO_DEMO_CLASSES
        assert {c['supercategory'] for c in data['categories']} == {'shape'}

        image_ids = [im['id'] for im in data['images']]
        assert len(image_ids) == len(set(image_ids)) == count
        for im in data['images']:
            assert im['file_name'] == f"{im['id']:012d}.jpg"
            pixels = np.asarray(Image.open(coco_root / split / im['file_name']))
            assert pixels.shape == (height, width, 3) and pixels.dtype == np.uint8
            assert (im['width'], im['height']) == (width, height)

        anns = data['annotations']
        assert len(anns) >= 2 * count
        assert len({a['id'] for a in anns}) == len(anns)
        for a in anns:
            assert a['image_id'] in image_ids and a['category_id'] in (1, 2, 3, 4)
            assert a['iscrowd'] == 0 and a['area'] > 0
            x, y, w, h = a['bbox']
            assert x >= 0 and y >= 0 and w > 0 and h > 0 and x + w <= width and y + h <= height
            (poly,) = a['segmentation']
            assert len(poly) >= 6 and len(poly) % 2 == 0
            xs, ys = poly[0::2], poly[1::2]
            assert [min(xs), min(ys)] == pytest.approx([x, y])
            assert [max(xs) - min(xs), max(ys) - min(ys)] == pytest.approx([w, h], abs=0.011)
            assert a['area'] <= w * h


def test_coco_loads_with_pycocotools_and_objects_stay_visible(coco_root):
    pycoco = pytest.importorskip('pycocotools.coco')
    api = pycoco.COCO(str(coco_root / 'annotations' / 'instances_val2017.json'))
    for image_id in api.getImgIds():
        anns = api.loadAnns(api.getAnnIds(imgIds=[image_id]))  # ids follow drawing order
        masks = [api.annToMask(a).astype(bool) for a in anns]
        for i, (a, mask) in enumerate(zip(anns, masks)):
            assert mask.sum() == pytest.approx(a['area'], rel=0.15)
            covered = np.zeros_like(mask)
            for later in masks[i + 1:]:
                covered |= later
            # Generator keeps >= 60 % on its own raster; allow for rasteriser differences.
            assert (mask & ~covered).sum() >= 0.55 * mask.sum()


def test_coco_deterministic_and_idempotent(coco_root, tmp_path):
    files = _files(coco_root)
    mtimes = {name: path.stat().st_mtime_ns for name, path in files.items()}
    summary = coco.generate_coco_like(str(coco_root), **COCO_ARGS)
    assert summary == {'root': str(coco_root), 'num_train': 3, 'num_val': 2,
                       'classes': coco.COCO_DEMO_CLASSES}
    assert {name: path.stat().st_mtime_ns for name, path in _files(coco_root).items()} == mtimes

    copy = tmp_path / 'copy'
    coco.generate_coco_like(str(copy), **COCO_ARGS)
    copy_files = _files(copy)
    assert set(copy_files) == set(files)
    for name, path in files.items():
        assert path.read_bytes() == copy_files[name].read_bytes(), name
    assert os.path.isfile(copy / '.synthetic_coco.json')
