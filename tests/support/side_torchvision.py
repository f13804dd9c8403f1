"""mmpretrain's models need torchvision, whose wheels are built for one torch each. Where make
setup found only a build for another variant of this torch (PyPI's CUDA build beside a CPU
torch, as on the project's CPU machines, which reach PyPI alone), it keeps that torchvision
outside the environment, in ``VENV/torchvision-without-ops``, and
:func:`use_torchvision_without_ops` puts it on the test run's path (this process's and its child
processes') with ``torchvision_without_ops/sitecustomize.py``: the tests then run
mmpretrain's real classifier, with torchvision's Python part and none of its compiled ops. Only
the test run sees it: the environment's tools and demos still lack torchvision.
"""
import importlib.util
import os
import os.path as osp
import sys

# where tools/setup_env.sh keeps a torchvision whose compiled ops cannot load beside this torch
SIDE_TORCHVISION = osp.join(sys.prefix, 'torchvision-without-ops')
SITECUSTOMIZE = osp.join(osp.dirname(__file__), 'torchvision_without_ops')


def use_torchvision_without_ops() -> bool:
    """Put make setup's side torchvision on this test run's path (module docstring) when no
    torchvision is installed and make setup kept one; whether it did. Call it before anything
    imports mmdet, which imports mmpretrain, hence torchvision, when they are there."""
    if importlib.util.find_spec('torchvision') is not None or not osp.isdir(SIDE_TORCHVISION):
        return False
    paths = [SITECUSTOMIZE, SIDE_TORCHVISION]
    os.environ['PYTHONPATH'] = os.pathsep.join(
        paths + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    sys.path[:0] = paths
    # this process started before its path had it: run the file here under a name of its own
    spec = importlib.util.spec_from_file_location('nala_torchvision_without_ops',
                                                  osp.join(SITECUSTOMIZE, 'sitecustomize.py'))
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # kept: the op
    spec.loader.exec_module(module)  # schemas live as long as their torch.library.Library
    return True
