"""The generated ImageNet-layout set: read by mmpretrain's ImageNet dataset as the demo config
reads it, balanced, deterministic, cached, and refusing bad arguments."""
import hashlib
from collections import Counter

import pytest

from nala_mm.datasets.synthetic_imagenet import CLASSES, generate_imagenet_like
from tests.support.pretrain import requires_mmpretrain


def digest(root) -> str:
    files = sorted(p for p in root.rglob('*.JPEG'))
    return hashlib.sha1(b''.join(p.read_bytes() for p in files)).hexdigest()


@requires_mmpretrain
def test_mmpretrain_reads_the_layout_with_the_demo_classes(tmp_path):
    from mmengine.config import Config
    from mmpretrain.datasets import ImageNet

    from tests.helpers import REPO
    root = tmp_path / 'imagenet'
    info = generate_imagenet_like(str(root), num_train=3, num_val=2, image_size=(48, 64),
                                  progress=False)
    assert info['classes'] == CLASSES and info['chance_top1'] == 100 / len(CLASSES)
    metainfo = Config.fromfile(str(REPO / 'configs/demo/imagenet_demo_nala_cls.py')).metainfo
    assert tuple(metainfo['classes']) == CLASSES  # the config names the folders in their order
    for split, per_class in (('train', 3), ('val', 2)):
        dataset = ImageNet(data_root=str(root), split=split, metainfo=metainfo, pipeline=[])
        labels = [dataset.get_data_info(i)['gt_label'] for i in range(len(dataset))]
        assert Counter(labels) == {label: per_class for label in range(len(CLASSES))}
        first = dataset.get_data_info(0)
        assert f'/{split}/{CLASSES[first["gt_label"]]}/' in first['img_path']


def test_generation_is_deterministic_cached_and_trims_a_larger_earlier_set(tmp_path):
    a, b = tmp_path / 'a', tmp_path / 'b'
    generate_imagenet_like(str(a), num_train=2, num_val=1, image_size=(48, 48), progress=False)
    generate_imagenet_like(str(b), num_train=3, num_val=1, image_size=(48, 48), progress=False)
    generate_imagenet_like(str(b), num_train=2, num_val=1, image_size=(48, 48), progress=False)
    assert digest(a) == digest(b)  # same seed, same bytes; the third image per class removed
    stamp = a / '.synthetic_imagenet.json'
    mtime = stamp.stat().st_mtime_ns
    generate_imagenet_like(str(a), num_train=2, num_val=1, image_size=(48, 48), progress=False)
    assert stamp.stat().st_mtime_ns == mtime  # nothing rewritten
    c = tmp_path / 'c'
    generate_imagenet_like(str(c), num_train=2, num_val=1, image_size=(48, 48), seed=1,
                           progress=False)
    assert digest(c) != digest(a)


@pytest.mark.parametrize('kwargs, message', [
    (dict(num_train=0), r'num_train must be an integer >= 1, got 0'),
    (dict(image_size=(40, 64)), r'image_size entries must be >= 48 .* got \(40, 64\)'),
])
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_imagenet_like(str(tmp_path / 'x'), **kwargs)
    assert not (tmp_path / 'x').exists()
