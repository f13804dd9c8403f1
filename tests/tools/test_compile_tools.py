"""The tools' ``--compile``: mmengine's ``compile=True`` trains under tools/train.py and under
mmseg's own train.py, and its checkpoint loads strictly into an eager model; tools/test.py
--compile gives the eager mIoU on a checkpoint overfit to its images; tools/infer.py --compile
writes the eager label maps; tools/benchmark.py --compile reports the compile time apart.
Inductor compiles (C++ on this CPU, minutes): make test-extended."""
import glob
import json
import re

import numpy as np
import pytest
from PIL import Image

from nala_mm.apis.config_loading import build_model_from_config
from tests.helpers import load_run_checkpoint, run_tool, write_det_config, write_seg_config
from tests.tools.test_segmentation import ITERS, OVERFIT
from tests.tools.test_upstream_tools import OPT_IN, upstream

pytestmark = [pytest.mark.integration, pytest.mark.extended]

# compile=True under mmseg's own train.py: the optimizer update must run eager
# (docs/reports/speed.md)
UPSTREAM_COMPILE = '''compile = True
custom_hooks = [dict(type='RNGStateHook'), dict(type='EagerOptimizerUpdatesHook')]
'''


def miou_of(log: str) -> float:
    return float(re.search(r'metrics: aAcc=[\d.]+, mIoU=([\d.]+)', log).group(1))


def test_compiled_training_under_both_train_tools_saves_an_eager_checkpoint(tmp_path, tiny_ade):
    config = write_seg_config(tmp_path, tiny_ade, iters=2)
    log = run_tool('tools/train.py', config, '--compile', '--work-dir', tmp_path / 'ours')
    assert 'Model has been "compiled"' in log and re.search(r'Iter\(train\) \[2/2\]', log)
    state = load_run_checkpoint(tmp_path / 'ours' / 'iter_2.pth')['state_dict']
    assert not any('_orig_mod' in key for key in state)
    eager, _ = build_model_from_config(config)
    eager.load_state_dict(state, strict=True)  # every key, no prefix

    upstream_cfg = write_seg_config(tmp_path, tiny_ade, iters=2, extra=OPT_IN + UPSTREAM_COMPILE,
                                    name='compiled.py')
    log = run_tool(upstream('mmseg', 'train.py'), upstream_cfg, '--work-dir',
                   tmp_path / 'mmseg', cwd=tmp_path)
    assert 'Model has been "compiled"' in log and re.search(r'Iter\(train\) \[2/2\]', log)


def test_compiled_test_and_infer_give_the_eager_results(tmp_path, tiny_ade):
    config = write_seg_config(tmp_path, tiny_ade, iters=ITERS, extra=OVERFIT)
    run_tool('tools/train.py', config, '--work-dir', tmp_path / 'work')
    ckpt = tmp_path / 'work' / f'iter_{ITERS}.pth'
    eager = miou_of(run_tool('tools/test.py', config, ckpt, '--work-dir', tmp_path / 'eager'))
    compiled_log = run_tool('tools/test.py', config, ckpt, '--compile', '--work-dir',
                            tmp_path / 'compiled')
    assert eager > 20  # far from chance (about 10): a wrong compiled path would show
    assert miou_of(compiled_log) == pytest.approx(eager, abs=0.01)

    maps = {}
    for flag in ('', '--compile'):
        out = tmp_path / f'infer{flag}'
        run_tool('tools/infer.py', config, ckpt, tiny_ade / 'images' / 'training', '--out-dir',
                 out, *([flag] if flag else []))
        maps[flag] = [np.asarray(Image.open(p)) for p in sorted(glob.glob(str(out / 'pred' /
                                                                             '*.png')))]
    assert len(maps['']) == 4
    agree = np.mean([np.mean(a == b) for a, b in zip(maps[''], maps['--compile'])])
    assert agree > 0.999  # float32 rounding may flip a pixel on a near-tie


def test_benchmark_tool_reports_the_compile_time_apart(tmp_path):
    out = tmp_path / 'bench.json'
    log = run_tool('tools/benchmark.py', 'configs/demo/ade20k_demo_nala_upernet.py', '--shape',
                   '128', '128', '--warmup', '1', '--repeat', '2', '--compile', '--out', out)
    assert re.search(r'compiled in [\d.]+ s \(the first call\)', log)
    model, = json.loads(out.read_text())['models']
    assert model['compile_seconds'] > 0 and model['latency_ms']['median'] > 0


def test_regional_compilation_trains_the_segmentor(tmp_path, tiny_ade):
    config = write_seg_config(tmp_path, tiny_ade, iters=2)
    log = run_tool('tools/train.py', config, '--compile', 'regional', '--work-dir', tmp_path)
    assert re.search(r'compiled regionally: CompiledRegions\(\d+ blocks of NaLaBlock\)', log)
    assert 'Model has been "compiled"' not in log and re.search(r'Iter\(train\) \[2/2\]', log)


TWO_SIZES = """
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs'),
]
coco_part = dict(type='CocoDataset', metainfo=dict(classes={classes}), pipeline=train_pipeline,
                 ann_file='annotations/instances_train2017.json',
                 data_prefix=dict(img='train2017/'), filter_cfg=dict(filter_empty_gt=True))
train_dataloader = dict(batch_size=1, dataset=dict(
    _delete_=True, type='ConcatDataset',
    datasets=[dict(coco_part, data_root='{first}'), dict(coco_part, data_root='{second}')]))
"""


def test_compiled_detector_training_follows_the_input_size(tmp_path, tiny_coco):
    """tools/train.py --compile on the demo Mask R-CNN, 4 iterations over images of two sizes
    (128 x 128 and 96 x 160, one per batch), the recompile limit raising: mmcv's NMS and
    RoIAlign break the graph and run eager, the backbone, neck and losses compile."""
    from nala_mm.datasets.synthetic_coco import COCO_DEMO_CLASSES, generate_coco_like
    other = tmp_path / 'coco_96x160'
    generate_coco_like(str(other), num_train=2, num_val=1, image_size=(96, 160), progress=False)
    config = write_det_config(tmp_path, tiny_coco, epochs=1,
                              extra=TWO_SIZES.format(first=f'{tiny_coco}/', second=f'{other}/',
                                                     classes=tuple(COCO_DEMO_CLASSES)))
    log = run_tool('tools/train.py', config, '--compile', '--work-dir', tmp_path / 'work',
                   timeout=3600)
    assert 'Model has been "compiled"' in log and re.search(r'Epoch\(train\) \[1\]\[4/4\]', log)
