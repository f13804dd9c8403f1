"""The long-range exemplar task's generator: the labels follow the rule (a region's class is set
by the distant exemplar, never by the region itself), the layout, determinism and argument
checks."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nala_mm.datasets.synthetic_ade import ADE_CLASS_NAMES
from projects.longrange import data as lr

SIZE = (112, 112)  # small images keep the tests fast (the task allows 108 px and up)
ARGS = dict(num_train=3, num_val=2, image_size=SIZE, seed=7, progress=False)
MATCH, OTHER = lr.LABEL_VALUE['windowpane'], lr.LABEL_VALUE['painting']


def scene(index: int, seed: int = 7) -> lr.Scene:
    return lr.sample_scene(lr.scene_rng(seed, 0, index), *SIZE)


def palette_index(colour) -> int:
    return int(np.argmin(np.abs(lr.PALETTE - np.asarray(colour, dtype=float)).sum(1)))


@pytest.fixture(scope='module')
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp('longrange') / 'ADEChallengeData2016'
    lr.generate_longrange(str(root), **ARGS)
    return root


def test_label_values_are_the_ade_indices_of_the_classes():
    assert lr.LONGRANGE_CLASSES == ('wall', 'windowpane', 'painting')
    assert [lr.LABEL_VALUE[c] for c in lr.LONGRANGE_CLASSES] == [1, 9, 23]
    assert all(ADE_CLASS_NAMES[lr.LABEL_VALUE[c] - 1] == c for c in lr.LONGRANGE_CLASSES)


def test_layout_files_and_label_values(root):
    files = {p.relative_to(root).as_posix() for p in root.rglob('*') if p.is_file()}
    expected = {'.longrange.json'}
    for code, (split, prefix, count) in enumerate((('training', 'ADE_train', 3),
                                                   ('validation', 'ADE_val', 2))):
        for i in range(count):
            expected |= {f'images/{split}/{prefix}_{i:08d}.jpg',
                         f'annotations/{split}/{prefix}_{i:08d}.png'}
            image = np.asarray(Image.open(root / 'images' / split / f'{prefix}_{i:08d}.jpg'))
            label = np.asarray(Image.open(root / 'annotations' / split / f'{prefix}_{i:08d}.png'))
            assert image.shape == SIZE + (3,) and label.shape == SIZE
            assert set(np.unique(label)) == {0, 1, MATCH, OTHER}
            # the exemplar, a band 32 px thick along an edge, is the only unlabelled area
            y0, x0, y1, x1 = lr.sample_scene(lr.scene_rng(7, code, i), *SIZE).exemplar_box
            assert lr.EXEMPLAR_PX == 32 == min(y1 - y0, x1 - x0)
            assert max(y1 - y0, x1 - x0) >= SIZE[0] - 16
            unlabelled = np.zeros(SIZE, bool)
            unlabelled[y0:y1, x0:x1] = True
            assert np.array_equal(label == lr.EXEMPLAR_VALUE, unlabelled)
    assert files == expected


def test_rendered_labels_follow_the_exemplar():
    """An object is 'windowpane' exactly when its colour is the framed exemplar's, read from
    the rendered pixels."""
    seen = set()
    for index in range(8):
        s = scene(index)
        image, label = lr.render(s)
        y0, x0, y1, x1 = s.exemplar_box
        exemplar = palette_index(image[y0 + 10:y1 - 10, x0 + 10:x1 - 10].reshape(-1, 3).mean(0))
        frame = image[y0:y0 + 2, x0:x1].astype(float).mean()
        assert frame > 235, frame  # the white frame marks the exemplar
        for obj in s.objects:
            colour = palette_index(image[obj.cy - 1:obj.cy + 2, obj.cx - 1:obj.cx + 2]
                                   .reshape(-1, 3).mean(0))
            assert colour == obj.colour
            expected = MATCH if colour == exemplar else OTHER
            assert np.all(label[lr._object_mask(obj, *np.mgrid[0:SIZE[0], 0:SIZE[1]])]
                          == expected), (index, obj)
            seen.add(expected)
            # the exemplar is out of every convolution's reach from the object
            assert lr.box_distance(obj.box, s.exemplar_box) >= lr.FAR_PX == 36
    assert seen == {MATCH, OTHER}


def test_changing_only_the_distant_exemplar_changes_the_class():
    """Same objects, same pixels outside the exemplar; another exemplar colour -> the objects
    of the new colour become 'matches' and the former matches 'differs'."""
    s = scene(0)
    image, label = lr.render(s)
    other_colour = next(o.colour for o in s.objects if o.colour != s.exemplar)
    changed = dataclasses.replace(s, exemplar=other_colour)
    image2, label2 = lr.render(changed)
    y0, x0, y1, x1 = s.exemplar_box
    outside = np.ones(label.shape, bool)
    outside[y0:y1, x0:x1] = False
    assert np.array_equal(image[outside], image2[outside])  # the regions: pixel for pixel
    assert not np.array_equal(image[~outside], image2[~outside])  # only the exemplar differs
    grid = np.mgrid[0:SIZE[0], 0:SIZE[1]]
    flipped = 0
    for obj in s.objects:
        mask = lr._object_mask(obj, *grid)
        before, after = label[mask][0], label2[mask][0]
        if obj.colour in (s.exemplar, other_colour):
            assert before != after  # exactly these objects change class
            flipped += int(mask.sum())
        else:
            assert before == after == OTHER
    assert flipped > 300
    assert np.array_equal(label == 1, label2 == 1)  # background unchanged


def test_identical_looking_regions_carry_either_class():
    """Across images each colour (and each shape) is either class about equally often, so the
    best classifier that sees only an object is at chance: 1/2. Scenes are drawn without
    rendering; a generator where colour told the class 60 % of the time would fail."""
    by_colour = np.zeros((len(lr.PALETTE), 2))
    by_shape = np.zeros((2, 2))
    for index in range(400):
        s = lr.sample_scene(lr.scene_rng(11, 0, index), *SIZE)
        for obj in s.objects:
            cls = int(obj.colour != s.exemplar)
            by_colour[obj.colour, cls] += 1
            by_shape[int(obj.shape == 'disc'), cls] += 1
    assert by_colour.sum() > 2000
    # per colour, the majority class's share: what the best colour -> class lookup scores
    # (a little above 1/2 from sampling alone; objects of one image share the exemplar, so
    # their counts vary more than independent draws)
    for counts in (by_colour, by_shape):
        best = counts.max(1).sum() / counts.sum()
        assert 0.5 <= best < 0.56, counts


def test_deterministic_and_cached(root, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in root.rglob('*') if p.is_file()}
    lr.generate_longrange(str(root), **ARGS)
    assert {p: p.stat().st_mtime_ns for p in root.rglob('*') if p.is_file()} == before
    copy = tmp_path / 'copy'
    summary = lr.generate_longrange(str(copy), **ARGS)
    for path in before:
        assert path.read_bytes() == (copy / path.relative_to(root)).read_bytes(), path
    assert summary['classes'] == lr.LONGRANGE_CLASSES
    assert sum(summary['class_pixel_fraction'].values()) == pytest.approx(1.0)


def test_chance_miou():
    # objects found exactly, classes guessed at random: IoU (f/2) / (f + F/2 - f/2) each
    fractions = {'wall': 0.9, 'a': 0.04, 'b': 0.06}
    expected = (1 + 0.02 / (0.04 + 0.05 - 0.02) + 0.03 / (0.06 + 0.05 - 0.03)) / 3
    assert lr.local_chance_miou(fractions) == pytest.approx(100 * expected)
    with pytest.raises(ValueError, match='background and object classes'):
        lr.local_chance_miou({'wall': 1.0})


@pytest.mark.parametrize('kwargs, message', [
    (dict(image_size=(100, 128)), 'at least 108 px.*got \\(100, 128\\)'),
    (dict(num_train=0), 'num_train.*got 0'),
    (dict(seed=-1), 'seed.*got -1'),
])
def test_bad_arguments_raise_before_writing(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        lr.generate_longrange(str(tmp_path / 'x'), **{**ARGS, **kwargs})
    assert not (tmp_path / 'x').exists()


def test_the_control_model_cannot_see_the_exemplar_from_an_object():
    """In the long-range config with the control mixer, the input pixels that can change a
    block of output logits lie within 32 px of it (stem, stage-1 block, decoder upsampling;
    eval mode), short of the exemplar's FAR_PX; with softmax attention the whole image can."""
    import torch
    from mmseg.models.utils import resize

    from nala_mm.apis.config_loading import build_model_from_config
    from tests.helpers import REPO

    config = str(REPO / 'projects' / 'longrange' / 'configs' / 'ade20k_longrange_segformer.py')

    def support(mixer: str) -> np.ndarray:
        model, _ = build_model_from_config(config,
                                           {'model.backbone.mixers': [dict(type=mixer)] * 4})
        model.init_weights()
        image = torch.randn(1, 3, 128, 128, requires_grad=True)
        logits = resize(model.decode_head(model.backbone(image)), size=(128, 128),
                        mode='bilinear', align_corners=False)
        weights = torch.randn(1, logits.shape[1], 8, 8)
        (logits[:, :, 60:68, 60:68] * weights).sum().backward()  # every phase of stride 4
        return (image.grad.abs().sum(dim=(0, 1)) > 0).numpy()

    ys, xs = np.nonzero(support('IdentityAttention'))
    reach = max(60 - ys.min(), ys.max() - 67, 60 - xs.min(), xs.max() - 67)
    assert 24 <= reach < lr.FAR_PX, reach
    assert support('SoftmaxAttention').all()  # attention reaches every pixel


@pytest.mark.parametrize('thickness', [20, 12])
def test_a_thinner_band_keeps_the_scene_and_the_distance_rule(thickness):
    """The graded study's difficulty axis: the band thins, its colours and position stay, every
    object stays FAR_PX from it, and the band's own pixels show the colour inside the frame."""
    for index in range(6):
        rng_args = (7, 0, index)
        thick = lr.sample_scene(lr.scene_rng(*rng_args), *SIZE)
        thin = lr.sample_scene(lr.scene_rng(*rng_args), *SIZE, exemplar_px=thickness)
        assert (thin.exemplar, thin.colours) == (thick.exemplar, thick.colours)
        y0, x0, y1, x1 = thin.exemplar_box
        ty0, tx0, ty1, tx1 = thick.exemplar_box
        assert (y0, x0) == (ty0, tx0) or (y1, x1) == (ty1, tx1)  # same edge, same margin
        assert min(y1 - y0, x1 - x0) == thickness
        assert all(lr.box_distance(o.box, thin.exemplar_box) >= lr.FAR_PX for o in thin.objects)
        image, label = lr.render(thin)
        inner = image[y0 + lr.FRAME_PX:y1 - lr.FRAME_PX, x0 + lr.FRAME_PX:x1 - lr.FRAME_PX]
        assert inner.size and np.abs(inner.reshape(-1, 3).mean(0)
                                     - np.asarray(thin.colours[thin.exemplar])).max() < 8
        assert (label[y0:y1, x0:x1] == lr.EXEMPLAR_VALUE).all()


def test_a_band_without_colour_is_refused_by_name():
    with pytest.raises(ValueError, match=r'exemplar_px must be at least 9 .* got 8'):
        lr.sample_scene(lr.scene_rng(7, 0, 0), *SIZE, exemplar_px=8)


def test_the_thickness_is_part_of_the_stamp(tmp_path):
    root = tmp_path / 'ADEChallengeData2016'
    lr.generate_longrange(str(root), **ARGS)
    first = (root / 'annotations' / 'validation' / 'ADE_val_00000000.png').read_bytes()
    lr.generate_longrange(str(root), **ARGS, exemplar_px=12)
    thin = (root / 'annotations' / 'validation' / 'ADE_val_00000000.png').read_bytes()
    assert thin != first  # regenerated, not skipped as current
    assert '"exemplar_px": 12' in (root / '.longrange.json').read_text()
