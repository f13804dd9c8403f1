"""Clear errors for missing or malformed data, from the project's tools.

A wrong ``data_root`` otherwise surfaces as a bare listing error deep inside mmengine, and a
broken COCO file as a ``KeyError: 'images'``. The tools run :func:`check_data` on the datasets of
the config's dataloaders before the Runner is built, and the run inside
:func:`explained_data_errors`; mmseg's and mmdet's dataset classes are untouched (under their own
``train.py`` the data is not checked). The checks only add a message; they never reject data the
original loader accepts:

* folders and files are checked only on the local file system; data behind another mmengine
  file backend (``s3://...``, ``backend_args=dict(backend='petrel')``) goes straight to the
  original loader, which reads it through that backend and reports its own errors;
* a segmentation dataset's annotation folder is required only when its pipeline loads
  annotations (inference on unlabelled images needs none);
* a COCO file is inspected only after mmdet's own loader has failed on it, and the
  inspection mirrors what mmdet 3.3 and pycocotools read (test-dev files without
  ``annotations``, ignored annotations without ``bbox`` and the like load unchanged).

The checked datasets are mmseg's ``BaseSegDataset`` and mmdet's ``CocoDataset`` and their
subclasses, also inside dataset wrappers (``ConcatDataset``, ``RepeatDataset``, ...).
"""
import contextlib
import copy
import importlib
import json
import os.path as osp
from typing import Iterator, List, Optional, Sequence, Tuple

from mmengine.config import Config

ADE20K_HELP = (
    'ADE20K is expected as <data_root>/images/{training,validation}/*.jpg and '
    '<data_root>/annotations/{training,validation}/*.png (data_root defaults to '
    'data/ade/ADEChallengeData2016). Unzip ADEChallengeData2016.zip into data/ade/, point the '
    'config at your copy with --cfg-options train_dataloader.dataset.data_root=PATH '
    'val_dataloader.dataset.data_root=PATH, or run `make demo` for the embedded synthetic data.')
SEG_HELP = (
    'Point the config at your copy with --cfg-options train_dataloader.dataset.data_root=PATH '
    'val_dataloader.dataset.data_root=PATH test_dataloader.dataset.data_root=PATH (the folders '
    'are data_root joined with the dataset\'s data_prefix).')
COCO_HELP = (
    'COCO is expected as <data_root>/annotations/instances_{train,val}2017.json with images in '
    '<data_root>/{train,val}2017/ (data_root defaults to data/coco/). Unzip the COCO 2017 '
    'archives there, point the config at your copy with --cfg-options '
    'train_dataloader.dataset.data_root=PATH, or run `make demo-det` for synthetic data.')
# pycocotools indexes 'images' and mmdet reads 'categories' unconditionally; 'annotations' is
# optional (COCO's test-dev image-info files have none).
COCO_REQUIRED_KEYS = ('images', 'categories')
# read by pycocotools' index for every annotation, and by mmdet's parse_data_info per image
ANN_INDEX_KEYS = ('id', 'image_id', 'category_id')
IMAGE_KEYS = ('id', 'file_name', 'height', 'width')


def is_local(path: str, backend_args: Optional[dict] = None) -> bool:
    """Whether mmengine's fileio would read ``path`` from the local file system: an explicit
    ``backend_args['backend']`` decides, else a URI prefix (``s3://``, ``http://``) means a
    remote backend, as in ``mmengine.fileio.get_file_backend``."""
    backend = (backend_args or {}).get('backend')
    if backend is not None:
        return backend == 'local'
    return '://' not in str(path)


def _transforms(node) -> Iterator:
    """Every transform of a pipeline, wrappers (``TestTimeAug``, ``RandomChoice``) included."""
    if isinstance(node, (list, tuple)):
        for item in node:
            yield from _transforms(item)
        return
    yield node
    for attr in ('transforms', 'subroutines', 'transform'):
        child = getattr(node, attr, None)
        if child is not None and child is not node:
            yield from _transforms(child)


def _loads_annotations(dataset) -> bool:
    return any('LoadAnnotations' in type(t).__name__ for t in _transforms(dataset.pipeline))


def _seg_help(dataset) -> str:
    try:
        from mmseg.datasets import ADE20KDataset
    except ImportError:  # pragma: no cover - mmseg is what installs this check
        ADE20KDataset = ()
    return ADE20K_HELP if isinstance(dataset, ADE20KDataset) else SEG_HELP


def _check_seg_folders(dataset) -> None:
    if dataset.ann_file:  # an index file lists the images; its own loader reports problems
        return
    for what, key in (('image', 'img_path'), ('annotation', 'seg_map_path')):
        folder = dataset.data_prefix.get(key)
        if not folder or not is_local(folder, dataset.backend_args) or osp.isdir(folder):
            continue
        if key == 'seg_map_path' and not _loads_annotations(dataset):
            continue  # nothing will read the label maps
        raise FileNotFoundError(
            f'{type(dataset).__name__}: {what} folder {folder} does not exist '
            f'(data_root={dataset.data_root!r}). {_seg_help(dataset)}')


def _is_box(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 4 and \
        all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)


def coco_problems(content, uses_stock_api: bool = True,
                  uses_stock_parser: bool = True) -> List[str]:
    """What in a loaded COCO json makes mmdet 3.3's ``CocoDataset`` fail; empty if nothing.

    Mirrors the reads of pycocotools' index (with ``uses_stock_api``: every annotation's ``id``,
    ``image_id``, ``category_id``) and, with ``uses_stock_parser``, of
    ``CocoDataset.parse_data_info``:
    each listed image's ``file_name``/``height``/``width``, and for each of its annotations
    that is not ``ignore``: a 4-number ``bbox``, then ``area`` where that box overlaps the image.
    """
    if not isinstance(content, dict):
        return [f'it must hold a COCO dict, found a {type(content).__name__}']
    missing = [key for key in COCO_REQUIRED_KEYS if key not in content]
    if missing:
        return [f'it is not COCO instances format: missing {missing} '
                f'(has {sorted(content)[:8]})']
    images, annotations = content['images'], content.get('annotations', [])
    problems = []
    for ann in annotations if uses_stock_api else ():
        absent = [key for key in ANN_INDEX_KEYS if key not in ann]
        if absent:
            problems.append(f'annotation {_describe(ann)} needs {absent}, got {_short(ann)}')
    if not images:
        problems.append("its 'images' list is empty: there is nothing to load")
    if not uses_stock_parser:
        return problems[:5]
    by_id = {}
    for image in images:
        absent = [key for key in IMAGE_KEYS if key not in image]
        if absent:
            problems.append(f'image {image.get("id", "?")} needs {absent}, got {_short(image)}')
        else:
            by_id[image['id']] = image
    for ann in annotations:
        image = by_id.get(ann.get('image_id'))
        if image is None or ann.get('ignore', False):
            continue  # mmdet never parses it
        if not _is_box(ann.get('bbox')):
            problems.append(f"annotation {_describe(ann)} needs a 4-number 'bbox' [x, y, w, h], "
                            f'got {_short(ann)}')
            continue
        x, y, w, h = ann['bbox']
        overlaps = min(x + w, image['width']) - max(x, 0) > 0 and \
            min(y + h, image['height']) - max(y, 0) > 0
        if overlaps and 'area' not in ann:
            problems.append(f"annotation {_describe(ann)} needs 'area', got {_short(ann)}")
    return problems[:5]


def _describe(ann) -> str:
    return f'id={ann.get("id")}' if isinstance(ann, dict) else repr(ann)[:40]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + '...'


def _diagnose_coco_file(dataset, path: str) -> Optional[str]:
    """Why mmdet failed on the local file ``path``, or None if the file looks fine."""
    try:
        with open(path, encoding='utf-8') as f:
            content = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return f'annotation file {path} is not valid JSON: {err}'
    except OSError:
        return None
    from mmdet.datasets import CocoDataset
    # subclasses with their own index or parser (CocoPanopticDataset) read other keys
    cls = type(dataset)
    try:
        problems = coco_problems(content, cls.COCOAPI is CocoDataset.COCOAPI,
                                 cls.parse_data_info is CocoDataset.parse_data_info)
    except (TypeError, AttributeError, KeyError):  # stranger than the mirror handles: the
        return None                               # loader's own error stands
    if not problems:
        return None
    return f'annotation file {path}: ' + '; '.join(problems)


def _check_coco_file(dataset) -> None:
    path = dataset.ann_file
    if is_local(path, dataset.backend_args) and not osp.isfile(path):
        raise FileNotFoundError(f'{type(dataset).__name__}: annotation file {path} does not exist '
                                f'(data_root={dataset.data_root!r}). {COCO_HELP}')


def _diagnose_coco(dataset) -> Optional[str]:
    if not is_local(dataset.ann_file, dataset.backend_args):
        return None
    return _diagnose_coco_file(dataset, dataset.ann_file)


def _leaf_configs(dataset_cfg) -> Iterator[dict]:
    """The dataset configs inside a (possibly wrapped) dataset config."""
    if isinstance(dataset_cfg, dict):
        if isinstance(dataset_cfg.get('dataset'), dict):
            yield from _leaf_configs(dataset_cfg['dataset'])
        elif isinstance(dataset_cfg.get('datasets'), (list, tuple)):
            for each in dataset_cfg['datasets']:
                yield from _leaf_configs(each)
        else:
            yield dataset_cfg


# the checked dataset base class of each default scope, and whether it is COCO's
CHECKED = {'mmseg': ('mmseg.datasets', 'BaseSegDataset', False),
           'mmdet': ('mmdet.datasets', 'CocoDataset', True)}


def _datasets(cfg: Config, loaders: Sequence[str]) -> Iterator[Tuple[object, bool]]:
    """(dataset, whether it is a COCO one) for the checked datasets of ``cfg``'s ``loaders``,
    built with ``lazy_init=True``: paths joined and pipeline built as the Runner's would be,
    nothing listed or read yet."""
    scope = cfg.get('default_scope', 'mmseg')
    if scope not in CHECKED:
        return
    package, name, is_coco = CHECKED[scope]
    base = getattr(importlib.import_module(package), name)
    registry = importlib.import_module(f'{scope}.registry').DATASETS
    for loader in loaders:
        for dataset_cfg in _leaf_configs((cfg.get(loader) or {}).get('dataset')):
            cls = dataset_cfg.get('type')
            cls = cls if isinstance(cls, type) else registry.get(cls)
            if isinstance(cls, type) and issubclass(cls, base):
                yield registry.build(dict(copy.deepcopy(dataset_cfg), lazy_init=True)), is_coco


def check_data(cfg: Config, loaders: Sequence[str]) -> None:
    """Before the Runner is built: raise ``FileNotFoundError``, saying where the data is expected,
    when a local folder or annotation file of ``cfg``'s ``loaders`` (e.g. ``'train_dataloader'``)
    is missing."""
    for dataset, is_coco in _datasets(cfg, loaders):
        (_check_coco_file if is_coco else _check_seg_folders)(dataset)


@contextlib.contextmanager
def explained_data_errors(cfg: Config, loaders: Sequence[str]) -> Iterator[None]:
    """An error inside (the Runner loading the data, or failing on a dataset that loaded
    nothing) becomes a ``ValueError`` that names what is wrong in a local COCO file of ``cfg``'s
    ``loaders``, when one is wrong; other errors stand."""
    try:
        yield
    except Exception as err:
        for dataset, is_coco in _datasets(cfg, loaders):
            message = _diagnose_coco(dataset) if is_coco else None
            if message is not None:
                raise ValueError(message) from err
        raise
