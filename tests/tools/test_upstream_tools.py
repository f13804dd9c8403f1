"""The configs under the upstream packages' own tools (what `mim train mmseg ...` runs): mmseg's and
mmdet's train.py train and resume (a Runner checkpoint loaded under torch's weights-only
unpickling, which the configs' `nala_mm.compat` import makes possible), and their test.py
evaluates the checkpoint. Nothing of this project's tools/ is involved."""
import os.path as osp
import re

import pytest

from tests.helpers import run_tool, write_det_config, write_seg_config

pytestmark = pytest.mark.integration


def upstream(package: str, tool: str) -> str:
    module = __import__(package)
    return osp.join(osp.dirname(module.__file__), '.mim', 'tools', tool)


@pytest.mark.extended
def test_mmseg_tools_train_resume_and_test(tmp_path, tiny_ade):
    work = tmp_path / 'work'
    log = run_tool(upstream('mmseg', 'train.py'), write_seg_config(tmp_path, tiny_ade, iters=1),
                   '--work-dir', work, cwd=tmp_path)
    assert re.search(r'Iter\(train\) \[1/1\]', log) and (work / 'iter_1.pth').is_file()

    log = run_tool(upstream('mmseg', 'train.py'), write_seg_config(tmp_path, tiny_ade, iters=2),
                   '--work-dir', work, '--resume', cwd=tmp_path)
    assert 'resumed epoch: 0, iter: 1' in log
    assert re.search(r'Iter\(train\) \[2/2\]', log) and not re.search(r'Iter\(train\) \[1/2\]',
                                                                        log)
    log = run_tool(upstream('mmseg', 'test.py'), write_seg_config(tmp_path, tiny_ade, iters=2),
                   work / 'iter_2.pth', '--work-dir', tmp_path / 'test', cwd=tmp_path)
    assert re.search(r'Iter\(test\) \[\d+/\d+\].*mIoU: [\d.]+', log)


@pytest.mark.extended
def test_mmdet_tools_train_resume_and_test(tmp_path, tiny_coco):
    work = tmp_path / 'work'
    log = run_tool(upstream('mmdet', 'train.py'), write_det_config(tmp_path, tiny_coco, epochs=1),
                   '--work-dir', work, cwd=tmp_path)
    assert re.search(r'Epoch\(train\) \[1\]\[1/1\].*loss_mask: [\d.]+', log)
    assert (work / 'epoch_1.pth').is_file()

    log = run_tool(upstream('mmdet', 'train.py'),
                   write_det_config(tmp_path, tiny_coco, epochs=2, name='det2.py'),
                   '--work-dir', work, '--resume', cwd=tmp_path)
    assert 'resumed epoch: 1, iter: 1' in log and re.search(r'Epoch\(train\) \[2\]\[1/1\]', log)
    log = run_tool(upstream('mmdet', 'test.py'),
                   write_det_config(tmp_path, tiny_coco, epochs=2, name='det2.py'),
                   work / 'epoch_2.pth', '--work-dir', tmp_path / 'test', cwd=tmp_path)
    assert re.search(r'coco/bbox_mAP: [\d.]+', log)
