"""``mim train nala_mm nalaformer-t_8xb128-300e_in1k.py`` from an empty folder: mim finds the
config in the installed package (the checkout's in-place install) and the run stops at the
missing ImageNet folder, not at an import (``make test-extended``)."""
import os

import pytest

from tests.helpers import PYTHON, REPO, tool_env
from tests.support.pretrain import requires_mmpretrain

pytestmark = [pytest.mark.extended, pytest.mark.integration, requires_mmpretrain]


def test_mim_finds_the_imagenet_config_and_stops_at_the_missing_data(tmp_path):
    import subprocess
    env = tool_env()  # without the checkout on the path: the package as mim finds it
    env['PYTHONPATH'] = os.pathsep.join(p for p in env['PYTHONPATH'].split(os.pathsep)
                                        if p != str(REPO))
    proc = subprocess.run([PYTHON, '-m', 'mim', 'train', 'nala_mm',
                           'nalaformer-t_8xb128-300e_in1k.py'], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert 'will use ' in out and 'configs/imagenet/nalaformer-t_8xb128-300e_in1k.py' in out
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'data/imagenet/train'" in out
    assert 'ImportError' not in out and 'ModuleNotFoundError' not in out
