"""``import nala_mm`` registers and loads nothing it does not register (the tools' ``apis``, the
measuring ``analysis`` and the opt-in ``compat`` load on use), and the module names the README and
docs showed before 0.1.0's layout still resolve, with a warning naming the new home."""
import json
import subprocess
import sys
import warnings

import pytest

import nala_mm
from tests.helpers import REPO

LOADED = r'''
import json, sys
import nala_mm
print(json.dumps(sorted(m for m in sys.modules if m.startswith('nala_mm.'))))
'''


@pytest.mark.integration
def test_import_loads_the_registering_subpackages_only():
    proc = subprocess.run([sys.executable, '-c', LOADED], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    subpackages = {m.split('.')[1] for m in loaded}
    assert subpackages == {'engine', 'models', 'ops', 'registry', 'version'}, loaded


@pytest.mark.parametrize('old, new', sorted(nala_mm.MOVED.items()))
def test_moved_module_names_resolve_with_a_warning(old, new):
    with pytest.warns(FutureWarning, match=f'nala_mm.{old} moved to {new}'):
        module = getattr(nala_mm, old)
    assert module is sys.modules[new]


def test_an_unknown_attribute_still_raises():
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with pytest.raises(AttributeError, match="has no attribute 'compiled'"):
            nala_mm.compiled  # noqa: B018
