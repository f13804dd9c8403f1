"""tools/check_env.py on a machine with CUDA: mmcv's NMS and RoIAlign must run on CUDA tensors,
and an mmcv built without CUDA kernels is named with the rebuild. Without a GPU here, CUDA is
reported available (the branch a GPU machine takes) and the real, CPU-built mmcv is checked."""
import importlib.util

import mmcv.ops
import pytest
import torch

from tests.helpers import REPO


@pytest.fixture
def check_env():
    spec = importlib.util.spec_from_file_location('check_env', REPO / 'tools' / 'check_env.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_the_cpu_ops_pass(check_env, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    check_env.main()
    out = capsys.readouterr().out
    assert '[check_env] ok' in out and 'no CUDA device: CPU ops only' in out


def test_with_cuda_an_mmcv_without_cuda_ops_is_refused_with_the_rebuild(check_env, capsys,
                                                                        monkeypatch):
    assert mmcv.ops.get_compiling_cuda_version() == 'not available'  # this machine's CPU build
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    with pytest.raises(SystemExit) as exit:
        check_env.main()
    assert exit.value.code == 1
    err = capsys.readouterr().err
    assert 'mmcv was built without CUDA ops although CUDA' in err
    assert 'pip uninstall -y mmcv && pip cache remove mmcv' in err
    assert 'FORCE_CUDA=1 make setup' in err


def test_with_cuda_ops_that_fail_on_cuda_tensors_the_error_says_how_to_rebuild(check_env, capsys,
                                                                              monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(mmcv.ops, 'get_compiling_cuda_version', lambda: '12.6')
    with pytest.raises(SystemExit):
        check_env.main()
    err = capsys.readouterr().err
    assert "mmcv's ops failed on CUDA tensors" in err and 'mmcv was built for CUDA 12.6' in err
    assert 'FORCE_CUDA=1' in err
