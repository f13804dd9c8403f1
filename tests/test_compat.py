"""`import nala_mm` registers and changes nothing else; `nala_mm.compat` makes the host changes
only when asked (``install()``, ``installed()``, a config's ``nala_mm.compat.enable`` import)."""
import ast
import json
import pathlib
import subprocess
import sys

import pytest

# Run in a fresh interpreter, so that nothing else of the suite has touched the hosts.
PROBE = r'''
import copyreg, json
import torch
import mmengine.dist.utils as dist_utils
from mmengine.fileio import LocalBackend
from mmengine.fileio.backends import registry_utils
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader
from mmseg.datasets import BaseSegDataset
from mmdet.datasets import CocoDataset
from mmengine.optim import OptimWrapper

def host_state():
    return dict(
        loader=CheckpointLoader._schemes[''],
        put=LocalBackend.put,
        put_text=LocalBackend.put_text,
        getstate=HistoryBuffer.__dict__.get('__getstate__'),
        setstate=HistoryBuffer.__dict__.get('__setstate__'),
        reduce=copyreg.dispatch_table.get(HistoryBuffer),
        init_dist=dist_utils._init_dist_pytorch,
        init_dist_public=dist_utils.init_dist,
        seg_load=BaseSegDataset.load_data_list,
        coco_load=CocoDataset.load_data_list,
        update_params=OptimWrapper.update_params,
        backends=tuple(sorted(registry_utils.backends)),
        # torch allow-lists types of its own as its submodules are first imported (DTensor's,
        # dynamo's), whoever imports them: those are not the plugin's changes
        safe_globals=frozenset(g for g in torch.serialization.get_safe_globals()
                               if not getattr(g, '__module__', '').startswith('torch.')),
    )

def changed(a, b):
    return sorted(k for k in a if not (a[k] is b[k] or a[k] == b[k]))

states = {'before': host_state()}
import nala_mm
states['import nala_mm'] = host_state()
from nala_mm import compat
states['import nala_mm.compat'] = host_state()
with compat.installed():
    states['inside installed()'] = host_state()
    with compat.installed():  # nested: the inner exit keeps the outer's changes
        pass
    states['after a nested installed()'] = host_state()
states['after installed()'] = host_state()
compat.install()
states['install()'] = host_state()
compat.install()
with compat.installed():
    pass
states['second install(), then installed()'] = host_state()
before = states['before']
print(json.dumps({name: changed(before, state) for name, state in states.items()}))
'''
INSTALLED = ['backends', 'reduce', 'safe_globals']  # the changes compat.install() makes


def test_import_changes_nothing_and_installed_undoes_each_change():
    """``import nala_mm`` and ``import nala_mm.compat`` leave mmengine, torch, mmseg and mmdet as
    they were; ``installed()`` makes the three changes and undoes them on exit; ``install()`` makes
    them for the process, idempotently. The other objects compat once patched stay untouched."""
    out = subprocess.run([sys.executable, '-c', PROBE], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {
        'before': [], 'import nala_mm': [], 'import nala_mm.compat': [],
        'inside installed()': INSTALLED, 'after a nested installed()': INSTALLED,
        'after installed()': [], 'install()': INSTALLED,
        'second install(), then installed()': INSTALLED}


def test_a_config_opts_in_with_one_import(tmp_path):
    """``custom_imports=dict(imports=['nala_mm', 'nala_mm.compat.enable'])``: importing the
    module installs the changes (a config can only import)."""
    config = tmp_path / 'opt_in.py'
    config.write_text("custom_imports = dict(imports=['nala_mm', 'nala_mm.compat.enable'], "
                      'allow_failed_imports=False)\n')
    probe = ('import copyreg, torch\n'
             'from mmengine.config import Config\n'
             'from mmengine.logging import HistoryBuffer\n'
             'from nala_mm.compat.history_buffer import rebuild_history_buffer, '
             'reduce_history_buffer\n'
             'print(HistoryBuffer in copyreg.dispatch_table)\n'
             f'Config.fromfile({str(config)!r})\n'
             'print(copyreg.dispatch_table[HistoryBuffer] is reduce_history_buffer, '
             'rebuild_history_buffer in torch.serialization.get_safe_globals())')
    out = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ['False', 'True', 'True']


def _calls_with_force(path):
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and any(
                kw.arg == 'force' and isinstance(kw.value, ast.Constant) and kw.value.value
                for kw in node.keywords)]


def test_no_force_registration_anywhere():
    """mmengine owns the checkpoint scheme '' and the file backend 'local': the package only
    registers new names."""
    package = pathlib.Path(__file__).resolve().parents[1] / 'nala_mm'
    found = {str(p.relative_to(package)): _calls_with_force(p) for p in package.rglob('*.py')}
    assert {name: lines for name, lines in found.items() if lines} == {}


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
