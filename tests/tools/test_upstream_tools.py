"""The configs under the upstream packages' own tools (what `mim train mmseg ...` runs): mmseg's and
mmdet's train.py train and resume (a Runner checkpoint loaded under torch's weights-only
unpickling, which the opt-in import `nala_mm.compat.enable` makes possible; without it the resume
fails, as docs/user_guides/robustness.md says), and their test.py evaluates the checkpoint.
Nothing of this project's tools/ is involved."""
import os.path as osp
import re
import subprocess

import pytest

from tests.helpers import PYTHON, run_tool, tool_env, write_det_config, write_seg_config

pytestmark = pytest.mark.integration

# the one line that opts a config in to nala_mm.compat (docs/user_guides/robustness.md)
OPT_IN = ("custom_imports = dict(imports=['nala_mm', 'nala_mm.compat.enable'], "
          'allow_failed_imports=False)\n')


def upstream(package: str, tool: str) -> str:
    module = __import__(package)
    return osp.join(osp.dirname(module.__file__), '.mim', 'tools', tool)


@pytest.mark.extended
def test_mmseg_tools_train_resume_and_test(tmp_path, tiny_ade):
    def seg_config(iters):
        return write_seg_config(tmp_path, tiny_ade, iters=iters, extra=OPT_IN)
    work = tmp_path / 'work'
    log = run_tool(upstream('mmseg', 'train.py'), seg_config(1),
                   '--work-dir', work, cwd=tmp_path)
    assert re.search(r'Iter\(train\) \[1/1\]', log) and (work / 'iter_1.pth').is_file()

    log = run_tool(upstream('mmseg', 'train.py'), seg_config(2),
                   '--work-dir', work, '--resume', cwd=tmp_path)
    assert 'resumed epoch: 0, iter: 1' in log
    assert re.search(r'Iter\(train\) \[2/2\]', log) and not re.search(r'Iter\(train\) \[1/2\]',
                                                                        log)
    log = run_tool(upstream('mmseg', 'test.py'), seg_config(2),
                   work / 'iter_2.pth', '--work-dir', tmp_path / 'test', cwd=tmp_path)
    assert re.search(r'Iter\(test\) \[\d+/\d+\].*mIoU: [\d.]+', log)


@pytest.mark.extended
def test_mmdet_tools_train_resume_and_test(tmp_path, tiny_coco):
    def det_config(epochs, name):
        return write_det_config(tmp_path, tiny_coco, epochs=epochs, name=name, extra=OPT_IN)
    work = tmp_path / 'work'
    log = run_tool(upstream('mmdet', 'train.py'), det_config(1, 'det.py'),
                   '--work-dir', work, cwd=tmp_path)
    assert re.search(r'Epoch\(train\) \[1\]\[1/1\].*loss_mask: [\d.]+', log)
    assert (work / 'epoch_1.pth').is_file()

    log = run_tool(upstream('mmdet', 'train.py'),
                   det_config(2, 'det2.py'),
                   '--work-dir', work, '--resume', cwd=tmp_path)
    assert 'resumed epoch: 1, iter: 1' in log and re.search(r'Epoch\(train\) \[2\]\[1/1\]', log)
    log = run_tool(upstream('mmdet', 'test.py'),
                   det_config(2, 'det2.py'),
                   work / 'epoch_2.pth', '--work-dir', tmp_path / 'test', cwd=tmp_path)
    assert re.search(r'coco/bbox_mAP: [\d.]+', log)


@pytest.mark.extended
def test_without_the_opt_in_mmseg_tools_cannot_resume(tmp_path, tiny_ade):
    """A shipped config imports nala_mm alone: mmseg's train.py trains, and its resume fails
    under torch >= 2.6's weights-only loading on the message hub's HistoryBuffer (mmengine
    0.10.7), weights-only loading staying on."""
    work = tmp_path / 'work'
    run_tool(upstream('mmseg', 'train.py'), write_seg_config(tmp_path, tiny_ade, iters=1),
             '--work-dir', work, cwd=tmp_path)
    proc = subprocess.run([PYTHON, upstream('mmseg', 'train.py'),
                           write_seg_config(tmp_path, tiny_ade, iters=2), '--work-dir', str(work),
                           '--resume'], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=tool_env())
    assert proc.returncode != 0
    assert 'Unsupported global: GLOBAL mmengine.logging.history_buffer.HistoryBuffer' in \
        proc.stderr
