"""Shared fixtures: generated data in the real ADE20K/COCO layouts, and a seeded start for every
test. Plain helpers (the tool runner, config writers, ``rel_err``) are in tests/helpers.py.

The suite runs the plugin as a user who does not opt in to :mod:`nala_mm.compat` would: nothing
installs it here. Tests that need its changes in-process use ``nala_mm.compat.installed()``,
which undoes them on exit; the tools install it in their own processes (tests/test_compat.py).
"""
import random

import numpy as np
import pytest
import torch
from hypothesis import settings

from tests.support.side_torchvision import use_torchvision_without_ops

use_torchvision_without_ops()  # before nala_mm imports mmdet (tests/support/side_torchvision.py)

from nala_mm.datasets.synthetic_ade import generate_ade_like  # noqa: E402
from nala_mm.datasets.synthetic_cityscapes import generate_cityscapes_like  # noqa: E402
from nala_mm.datasets.synthetic_coco import generate_coco_like  # noqa: E402

# the same examples on every run (a failure reproduces; nothing new is drawn in CI)
settings.register_profile('nala', derandomize=True, deadline=None, print_blob=True)
settings.load_profile('nala')


@pytest.fixture(autouse=True)
def recompile_limit_raises():
    """Every compiled test: a function that hits dynamo's recompile limit raises instead of
    running eager in silence (which would pass a compiled test without compiling)."""
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts from the same generator states: its random tensors do not depend on
    which tests ran before it."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


@pytest.fixture(scope='session')
def tiny_ade(tmp_path_factory):
    """ADE20K layout: 4 training and 2 validation images of 96 x 96."""
    root = tmp_path_factory.mktemp('ade') / 'ADEChallengeData2016'
    generate_ade_like(str(root), num_train=4, num_val=2, image_size=(96, 96), progress=False)
    return root


@pytest.fixture(scope='session')
def small_ade(tmp_path_factory):
    """ADE20K layout: 8 training and 2 validation images of 96 x 96."""
    root = tmp_path_factory.mktemp('ade8') / 'ADEChallengeData2016'
    generate_ade_like(str(root), num_train=8, num_val=2, image_size=(96, 96), progress=False)
    return root


@pytest.fixture(scope='session')
def tiny_cityscapes(tmp_path_factory):
    """Cityscapes layout: 2 training and 2 validation images of 96 x 192."""
    root = tmp_path_factory.mktemp('cityscapes')
    generate_cityscapes_like(str(root), num_train=2, num_val=2, image_size=(96, 192),
                             progress=False)
    return root


@pytest.fixture(scope='session')
def tiny_coco(tmp_path_factory):
    """COCO layout: 2 training and 2 validation images of 128 x 128."""
    root = tmp_path_factory.mktemp('coco')
    generate_coco_like(str(root), num_train=2, num_val=2, image_size=(128, 128), progress=False)
    return root
