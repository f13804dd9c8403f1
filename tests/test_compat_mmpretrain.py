"""`import nala_mm` with mmpretrain installed: an ImageClassifier with NaLaFormer builds under
mmpretrain's default scope, the classification tail and its checkpoint hook join mmpretrain's
registries, and nothing of mmpretrain's changes; without mmpretrain nothing of it is imported.
As tests/test_compat.py does for mmseg and mmdet, in a fresh interpreter."""
import json
import subprocess
import sys

from tests.support.pretrain import requires_mmpretrain

# mmpretrain fully registered first (as its tools do), then nala_mm imported
PROBE = r'''
import json, inspect
import mmengine.registry as root
import mmpretrain.registry as pretrain
from mmpretrain.utils import register_all_modules
register_all_modules(init_default_scope=False)

def registries(module, scope):
    return {name: reg for name, reg in vars(module).items()
            if type(reg).__name__ == 'Registry' and reg.scope == scope}

def state():
    snapshot = {}
    for prefix, module in (('mmpretrain', pretrain), ('mmengine', root)):
        for name, reg in registries(module, prefix).items():
            for key, obj in reg.module_dict.items():
                members = sorted((k, id(v)) for k, v in vars(obj).items()) \
                    if inspect.isclass(obj) else None
                snapshot[f'{prefix}::{name}::{key}'] = [id(obj), members]
    return snapshot

before = state()
import nala_mm
after = state()
from mmengine.registry import init_default_scope
init_default_scope('mmpretrain')
model = pretrain.MODELS.build(dict(
    type='ImageClassifier',
    backbone=dict(type='NaLaFormer', arch=dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1),
                  num_heads=(1, 2, 4, 4)), out_indices=(3,), out_norm_cfg=None),
    neck=dict(type='NaLaFormerClsNeck', in_channels=64, out_channels=32),
    head=dict(type='LinearClsHead', num_classes=3, in_channels=32)))
import torch
logits = model(torch.randn(2, 3, 64, 64), mode='tensor')
print(json.dumps(dict(
    added=sorted(k for k in after if k not in before),
    removed=sorted(k for k in before if k not in after),
    changed=sorted(k for k in before if k in after and after[k] != before[k]),
    backbone=type(model.backbone).__module__ + '.' + type(model.backbone).__name__,
    in_root=pretrain.MODELS.get('NaLaFormer') is nala_mm.NaLaFormer,
    logits=list(logits.shape),
)))
'''

# mmpretrain made unimportable (as when it is not installed)
WITHOUT = r'''
import sys, json
sys.modules['mmpretrain'] = None
import nala_mm
print(json.dumps(dict(classifier='nala_mm.models.classifier' in sys.modules,
                      mmpretrain=any(m.startswith('mmpretrain.') for m in sys.modules))))
'''


def run(code: str) -> dict:
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@requires_mmpretrain
def test_import_registers_the_tail_in_mmpretrain_and_changes_nothing_else():
    result = run(PROBE)
    # (mmengine's root registries gain the backbone and mixers: tests/test_compat.py)
    assert [k for k in result['added'] if not k.startswith('mmengine::')] == [
        'mmpretrain::HOOKS::AuthorsCheckpointHook', 'mmpretrain::MODELS::NaLaFormerClsNeck']
    assert result['removed'] == [] and result['changed'] == []
    assert result['backbone'] == 'nala_mm.models.nalaformer.NaLaFormer'
    assert result['in_root'] is True  # found through mmengine's root registry
    assert result['logits'] == [2, 3]


def test_without_mmpretrain_nothing_of_it_is_imported():
    assert run(WITHOUT) == dict(classifier=False, mmpretrain=False)
