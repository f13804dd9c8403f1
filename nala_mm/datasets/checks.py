"""Clear errors for missing or malformed data, installed by :mod:`nala_mm.compat` on the upstream
dataset classes.

A wrong ``data_root`` otherwise surfaces as a bare listing error deep inside mmengine, and a
broken COCO file as a ``KeyError: 'images'``. The checks wrap ``load_data_list`` of mmseg's
``BaseSegDataset`` and mmdet's ``CocoDataset`` (so they also hold under ``mim train``), and only
add a message; they never reject data the original loader accepts:

* folders and files are checked only on the local file system; data behind another mmengine
  file backend (``s3://...``, ``backend_args=dict(backend='petrel')``) goes straight to the
  original loader, which reads it through that backend and reports its own errors;
* a segmentation dataset's annotation folder is required only when its pipeline loads
  annotations (inference on unlabelled images needs none);
* a COCO file is inspected only after mmdet's own loader has failed on it, and the
  inspection mirrors what mmdet 3.3 and pycocotools read (test-dev files without
  ``annotations``, ignored annotations without ``bbox`` and the like load unchanged).
"""
import functools
import json
import os.path as osp
from typing import Iterator, List, Optional

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


def _wrap(cls, check, diagnose=None) -> None:
    """``check`` runs before the original loader; ``diagnose`` only after it has failed (or
    loaded nothing, which mmengine's dataset then fails on with 'need at least one array to
    concatenate'), and replaces its error when it finds the cause."""
    original = cls.load_data_list
    if getattr(original, '_nala_checked', False):
        return

    @functools.wraps(original)
    def load_data_list(self):
        check(self)
        if diagnose is None:
            return original(self)
        try:
            data_list = original(self)
        except Exception as err:
            message = diagnose(self)
            if message is None:
                raise
            raise ValueError(message) from err
        if not data_list:
            message = diagnose(self)
            if message is not None:
                raise ValueError(message)
        return data_list

    load_data_list._nala_checked = True
    cls.load_data_list = load_data_list


def _diagnose_coco(dataset) -> Optional[str]:
    if not is_local(dataset.ann_file, dataset.backend_args):
        return None
    return _diagnose_coco_file(dataset, dataset.ann_file)


def install_dataset_checks() -> None:
    """Idempotent; installed by :mod:`nala_mm.compat` for whichever of mmseg/mmdet is
    installed."""
    try:
        from mmseg.datasets import BaseSegDataset
        _wrap(BaseSegDataset, _check_seg_folders)
    except ImportError:
        pass
    try:
        from mmdet.datasets import CocoDataset
        _wrap(CocoDataset, _check_coco_file, _diagnose_coco)
    except ImportError:
        pass
