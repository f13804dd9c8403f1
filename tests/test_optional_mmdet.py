"""mmdet is optional (``pip install nala-mm[det]``), as mmpretrain is: without it ``import nala_mm``
registers everything mmseg-scoped and imports nothing of mmdet, a segmentation config builds
and runs, and a detection config stops in the config loader and the tools with how to install
mmdet. With mmdet, its part is registered as before.

Without mmdet: a fresh interpreter in which mmdet and mmpretrain do not import, as when they are
not installed (as tests/test_compat_mmpretrain.py does for mmpretrain).
"""
import json
import subprocess
import sys

import pytest

from tests.helpers import DEMO_DET_CFG, DEMO_SEG_CFG, REPO

# mmdet: a finder that refuses it, so that every `import mmdet...` raises ModuleNotFoundError as
# with no mmdet installed, and 'mmdet' never enters sys.modules. mmpretrain: None in sys.modules,
# which importlib.util.find_spec (nala_mm's check for it) reads as not installed.
WITHOUT = r'''
import json, runpy, sys

class NoMMDet:
    def find_spec(self, name, path=None, target=None):
        if name == 'mmdet' or name.startswith('mmdet.'):
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        return None

sys.meta_path.insert(0, NoMMDet())
sys.modules['mmpretrain'] = None
SEG, DET, SCOPE_ONLY = sys.argv[1:4]

import nala_mm
import torch
from mmengine.config import Config
from mmseg.registry import MODELS
from nala_mm.apis.config_loading import build_model, build_model_from_config, load_config

model, scope = build_model_from_config(SEG)
with torch.no_grad():
    logits = model(torch.randn(1, 3, 64, 64), mode='tensor')

def refusal(call):
    try:
        call()
    except ModuleNotFoundError as error:
        return str(error)
    return None

def tool(script, *args):
    sys.argv = [script, *args]
    return refusal(lambda: runpy.run_path(f'tools/{script}', run_name='__main__'))

print(json.dumps(dict(
    file=nala_mm.__file__,
    scope=scope,
    backbone=type(model.backbone).__name__,
    logits=list(logits.shape),
    mmseg={name: MODELS.get(name).__module__ for name in (
        'NaLaSwinTransformer', 'NaLaMixVisionTransformer', 'NaLaVisionTransformer')},
    mmdet_modules=sorted(m for m in sys.modules if m == 'mmdet' or m.startswith('mmdet.')),
    det_parts=sorted(m for m in ('nala_mm.models.swap.detection', 'nala_mm.models.simple_fpn')
                     if m in sys.modules),
    simple_fpn=hasattr(nala_mm.models, 'SimpleFPN'),
    refusals=dict(
        inherited=refusal(lambda: load_config(DET)),
        scope_only=refusal(lambda: load_config(SCOPE_ONLY)),
        mmdet_path=refusal(lambda: build_model_from_config('mmdet::retinanet/x.py')),
        built=refusal(lambda: build_model(Config(dict(default_scope='mmdet',
                                                      model=dict(type='NaLaFormer')))))),
    # benchmark.py's measuring process, which builds the model (its parent only starts it)
    tools=dict(train=tool('train.py', DET), test=tool('test.py', DET, 'none.pth'),
               benchmark=tool('benchmark.py', '--case', json.dumps(dict(
                   configs=[DET], what='time', device='cpu', batch=1, shape=[64, 64]))))),
))
'''


@pytest.mark.integration
def test_without_mmdet_segmentation_works_and_detection_says_how_to_install_it(tmp_path):
    scope_only = tmp_path / 'scope_only.py'  # mmdet's scope, no mmdet:: base
    scope_only.write_text("default_scope = 'mmdet'\nmodel = dict(type='NaLaFormer')\n")
    proc = subprocess.run([sys.executable, '-c', WITHOUT, DEMO_SEG_CFG, DEMO_DET_CFG,
                           str(scope_only)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result['file'] == str(REPO / 'nala_mm' / '__init__.py')
    assert result['scope'] == 'mmseg' and result['backbone'] == 'NaLaFormer'
    assert result['logits'][:2] == [1, 6]  # the demo's six classes
    assert result['mmseg'] == {'NaLaSwinTransformer': 'nala_mm.models.swap.swin',
                               'NaLaMixVisionTransformer': 'nala_mm.models.swap.spatial_reduction',
                               'NaLaVisionTransformer': 'nala_mm.models.swap.vit'}
    assert result['mmdet_modules'] == [] and result['det_parts'] == []
    assert result['simple_fpn'] is False
    for where, message in {**result['refusals'], **result['tools']}.items():
        assert message is not None and 'pip install nala-mm[det]' in message, (where, message)
    assert result['refusals']['inherited'].startswith(DEMO_DET_CFG)


def test_with_mmdet_its_part_is_registered():
    from mmdet.registry import MODELS as DET_MODELS

    from nala_mm.models import LayerNorm2d, SimpleFPN
    from nala_mm.models.swap import (
        DetNaLaSwinTransformer,
        NaLaPyramidVisionTransformerV2,
        NaLaVisionTransformer,
    )
    assert {name: DET_MODELS.module_dict.get(name) for name in (
        'NaLaSwinTransformer', 'NaLaPyramidVisionTransformerV2', 'NaLaVisionTransformer',
        'SimpleFPN', 'LN2d')} == {
        'NaLaSwinTransformer': DetNaLaSwinTransformer,
        'NaLaPyramidVisionTransformerV2': NaLaPyramidVisionTransformerV2,
        'NaLaVisionTransformer': NaLaVisionTransformer, 'SimpleFPN': SimpleFPN,
        'LN2d': LayerNorm2d}
