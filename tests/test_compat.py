"""`import nala_mm` registers and changes nothing else; `nala_mm.compat` makes the host changes."""
import ast
import json
import pathlib
import subprocess
import sys

import pytest

# Run in a fresh interpreter: the test process itself has long imported nala_mm.compat.
PROBE = r'''
import json, sys
import torch
import mmengine.dist.utils as dist_utils
from mmengine.fileio import LocalBackend
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader
from mmseg.datasets import BaseSegDataset
from mmdet.datasets import CocoDataset
from mmengine.optim import OptimWrapper

def host_state():
    return dict(
        loader=CheckpointLoader._schemes[''],
        put=LocalBackend.put,
        getstate=HistoryBuffer.__dict__.get('__getstate__'),
        setstate=HistoryBuffer.__dict__.get('__setstate__'),
        init_dist=dist_utils._init_dist_pytorch,
        seg_load=BaseSegDataset.load_data_list,
        coco_load=CocoDataset.load_data_list,
        update_params=OptimWrapper.update_params,
        # torch allow-lists types of its own as its submodules are first imported (DTensor's,
        # dynamo's), whoever imports them: those are not the plugin's changes
        safe_globals=tuple(g for g in torch.serialization.get_safe_globals()
                           if not getattr(g, '__module__', '').startswith('torch.')),
    )

before = host_state()
import nala_mm
after_import = host_state()
import nala_mm.compat
after_compat = host_state()
nala_mm.compat.install()
after_second_install = host_state()
print(json.dumps(dict(
    unchanged_by_import=[k for k in before if after_import[k] is before[k]
                         or (k == 'safe_globals' and after_import[k] == before[k])],
    changed_by_compat=[k for k in before if after_compat[k] != before[k]],
    compat_idempotent=after_second_install == after_compat,
    n_safe_globals=[len(before['safe_globals']), len(after_compat['safe_globals'])],
)))
'''


def test_import_changes_nothing_and_compat_changes_each_listed_object():
    out = subprocess.run([sys.executable, '-c', PROBE], capture_output=True, text=True,
                         check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    keys = ['loader', 'put', 'getstate', 'setstate', 'init_dist', 'seg_load', 'coco_load',
            'update_params', 'safe_globals']
    assert sorted(result['unchanged_by_import']) == sorted(keys)
    assert sorted(result['changed_by_compat']) == sorted(keys)
    assert result['compat_idempotent'] is True
    before, after = result['n_safe_globals']
    assert after > before  # HistoryBuffer and the numpy reconstructors were added


def _calls_with_force(path):
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and any(
                kw.arg == 'force' and isinstance(kw.value, ast.Constant) and kw.value.value
                for kw in node.keywords)]


def test_no_force_registration_outside_compat():
    package = pathlib.Path(__file__).resolve().parents[1] / 'nala_mm'
    found = {str(p.relative_to(package)): _calls_with_force(p) for p in package.rglob('*.py')}
    assert {name: lines for name, lines in found.items() if lines} == {
        'compat.py': found['compat.py']}
    assert len(found['compat.py']) == 1  # the checkpoint loader's scheme, and nothing else


def test_second_module_under_a_registered_name_raises_naming_both():
    from mmengine.registry import MODELS

    from nala_mm.registry import register_model

    assert MODELS.get('NaLaFormer') is not None

    class NaLaFormer:  # noqa: N801 - deliberately the registered name
        pass

    with pytest.raises(KeyError, match=r'NaLaFormer is already registered.*nala_mm\.models'
                                       r'\.nalaformer\.NaLaFormer.*test_compat'):
        register_model(NaLaFormer)


def test_scope_neutral_modules_resolve_under_both_default_scopes():
    from mmdet.registry import MODELS as DET_MODELS
    from mmseg.registry import MODELS as SEG_MODELS

    import nala_mm  # noqa: F401
    for registry in (SEG_MODELS, DET_MODELS):
        assert registry.get('NaLaFormer') is nala_mm.NaLaFormer
        assert registry.get('NormAwareLinearAttention') is nala_mm.NormAwareLinearAttention


def test_a_scoped_subclass_goes_into_that_packages_registry_only():
    from mmengine.registry import MODELS as ROOT
    from mmseg.models.backbones import MixVisionTransformer
    from mmseg.registry import MODELS as SEG_MODELS

    from nala_mm.registry import register_model

    @register_model(scope='mmseg')
    class ScopedProbeMiT(MixVisionTransformer):
        pass

    assert SEG_MODELS.module_dict['ScopedProbeMiT'] is ScopedProbeMiT
    assert 'ScopedProbeMiT' not in ROOT.module_dict
    with pytest.raises(KeyError, match=r'ScopedProbeMiT is already registered in mmseg::model'):
        register_model(ScopedProbeMiT, scope='mmseg')
