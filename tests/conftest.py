"""Shared fixtures: generated data in the real ADE20K/COCO layouts, and a seeded start for every
test. Plain helpers (the tool runner, config writers, ``rel_err``) are in tests/helpers.py.

The suite runs with :mod:`nala_mm.compat` installed, as the project's tools do; what a bare
``import nala_mm`` changes is checked in a fresh interpreter (tests/test_compat.py).
"""
import random

import numpy as np
import pytest
import torch
from hypothesis import settings

import nala_mm.compat  # noqa: F401
from nala_mm.datasets.synthetic_ade import generate_ade_like
from nala_mm.datasets.synthetic_cityscapes import generate_cityscapes_like
from nala_mm.datasets.synthetic_coco import generate_coco_like

# Tests that start processes (marked ``integration``) cost seconds each in interpreter start-up
# alone. ``make test`` keeps those below; every other one is marked ``extended`` and runs under
# ``make test-extended`` (the tool and upstream-tool checks, ONNX export by the tool, dist_test,
# the wheel and mim, the docs' shell snippets). The slurm-script checks start bash only, and the
# docs' usage lines share one interpreter for all their --help checks.
SLURM = 'tests/tools/test_slurm_scripts.py::'
CORE_INTEGRATION = (
    SLURM + 'test_scripts_are_executable_and_parse',
    SLURM + 'test_slurm_train_runs_one_task_per_gpu_with_the_slurm_launcher',
    SLURM + 'test_slurm_test_passes_the_checkpoint_and_defaults_to_8_gpus',
    SLURM + 'test_fewer_than_8_gpus_fit_on_one_node',
    SLURM + 'test_missing_arguments_print_the_usage',
    SLURM + 'test_the_tools_parse_what_the_scripts_pass',
    'tests/docs/test_snippets.py::test_usage_snippet_names_real_commands_and_options',
    'tests/tools/test_resume.py::test_sigkill_then_resume_continues_with_identical_losses',
    'tests/tools/test_resume.py::test_two_ranks_train_alike_and_resume_their_own_random_streams',
    'tests/tools/test_segmentation.py::test_training_lowers_the_loss_on_its_fixed_batch',
    'tests/tools/test_segmentation.py::'
    'test_test_tool_gives_the_validation_miou_and_that_of_its_label_maps',
    'tests/tools/test_segmentation.py::test_infer_tool_writes_the_test_tools_label_maps',
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker('integration') and \
                item.nodeid.split('[')[0] not in CORE_INTEGRATION:
            item.add_marker(pytest.mark.extended)


# the same examples on every run (a failure reproduces; nothing new is drawn in CI)
settings.register_profile('nala', derandomize=True, deadline=None, print_blob=True)
settings.load_profile('nala')


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
