"""``--report-only`` writes the committed pages and figures again, byte for byte, from the
committed per-run results alone (no data on disk, nothing trained), into a scratch folder."""
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from projects.longrange.data import generate_longrange, validation_image
from projects.longrange.study import RESULTS
from tests.helpers import REPO

pytestmark = pytest.mark.integration  # each report is written by its command, in a process

STUDY_FILES = ('longrange.json', 'longrange.md', 'longrange.png')
GRADED_FILES = ('longrange_graded.json', 'longrange_graded.md', 'longrange_graded.png')


def report_only(module: str, *args: str) -> None:
    proc = subprocess.run([sys.executable, '-m', module, '--report-only', *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_study_page_and_figure_are_the_committed_bytes(tmp_path):
    shutil.copy(f'{RESULTS}/longrange.json', tmp_path)
    report_only('projects.longrange.study', '--out', str(tmp_path))
    for name in STUDY_FILES:
        assert (tmp_path / name).read_bytes() == (REPO / RESULTS / name).read_bytes(), name


def test_the_graded_report_is_the_committed_bytes(tmp_path):
    """The runs and levels are read where they are committed; the plan is the committed one (its
    path and commit go into the report), so only the output folder is a scratch one."""
    (tmp_path / 'longrange_graded').symlink_to(f'{RESULTS}/longrange_graded')
    report_only('projects.longrange.graded', '--out', str(tmp_path))
    for name in GRADED_FILES:
        assert (tmp_path / name).read_bytes() == (REPO / RESULTS / name).read_bytes(), name


def test_the_pictured_image_is_the_generated_file(tmp_path):
    """What the report pictures without the data is what the generator wrote to disk."""
    root = tmp_path / 'ADEChallengeData2016'
    generate_longrange(str(root), num_train=1, num_val=2, progress=False)
    for index in range(2):
        stored = np.asarray(Image.open(root / 'images' / 'validation' /
                                       f'ADE_val_{index:08d}.jpg'))
        assert stored.shape == (128, 128, 3)
        np.testing.assert_array_equal(validation_image(index), stored)
    assert not np.array_equal(validation_image(0), validation_image(1))
