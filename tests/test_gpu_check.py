"""The GPU check's rehearsal (benchmarks/gpu_check.py): a Python 3.12 environment built only from
the wheels of what the GPU machine already holds (its torch 2.11 included), the carried wheels
installed by the script itself, and the whole script run on the CPU at tiny sizes. It then has
bootstrapped mmengine, mmseg and mmdet from the wheels behind mmcv's stand-in compiled module,
run every stage in its own process and written at most 8 files, each result with its numbers.

Needs python3.12 and ``make gpu-wheels`` (about 2.7 GB, once); skipped, naming what is missing,
without them. In make test-extended (installing the environment takes about a minute, the
stages up to fifteen)."""
import glob
import json
import os
import os.path as osp
import shutil
import subprocess

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.extended
WHEELS = REPO / '.gpu_wheels'


def python312() -> str:
    """A Python 3.12 interpreter that runs: on the PATH, or one pyenv installed."""
    candidates = [shutil.which('python3.12'),
                  *sorted(glob.glob(osp.expanduser('~/.pyenv/versions/3.12*/bin/python3.12')))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, '--version'], capture_output=True).returncode == 0:
            return candidate
    pytest.skip('no Python 3.12 interpreter runs here (the GPU machine has 3.12)')


def machine_site(python: str) -> str:
    """The GPU machine's packages, installed once into .gpu_wheels/rehearsal (reused while the
    wheels are the same)."""
    wheels = sorted(glob.glob(str(WHEELS / 'machine' / '*.whl')))
    carried = glob.glob(str(WHEELS / 'carry' / '*.whl'))
    if not wheels or not carried:
        pytest.skip(f'no wheels in {WHEELS}/machine and {WHEELS}/carry: run make gpu-wheels')
    site, stamp = WHEELS / 'rehearsal', WHEELS / 'rehearsal.stamp'
    listing = '\n'.join(osp.basename(w) for w in wheels)
    if not (stamp.exists() and stamp.read_text() == listing):
        shutil.rmtree(site, ignore_errors=True)
        subprocess.run([python, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps',
                        '--no-compile', '--target', str(site), *wheels], check=True)
        stamp.write_text(listing)
    return str(site)


def test_the_gpu_check_runs_on_the_machines_packages_alone(tmp_path):
    python = python312()
    site = machine_site(python)
    out = tmp_path / 'out'
    # nothing of this project's environment: the machine's packages, then what the script adds
    env = {key: value for key, value in os.environ.items()
           if key not in ('PYTHONPATH', 'VIRTUAL_ENV', 'PYTHONHOME')}
    env.update(PYTHONPATH=site, PYTHONNOUSERSITE='1')
    proc = subprocess.run([python, '-m', 'benchmarks.gpu_check', '--out', str(out), '--device',
                           'cpu', '--tiny', '--repeats', '1', '--warmup', '0',
                           # the CPU compiles for minutes what a GPU machine's 16 cores do in one
                           '--budget', '6'],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(os.listdir(out))
    assert files == ['attention.json', 'backbones.json', 'compiled_training.json',
                     'cuda_tests.json', 'gpu_check.log', 'summary.md'], files
    results = {name: json.loads((out / f'{name}.json').read_text())
               for name in ('attention', 'backbones', 'compiled_training', 'cuda_tests')}
    for name, data in results.items():
        assert data['done'], (name, (out / 'gpu_check.log').read_text()[-3000:])
        # the machine's own torch and numpy; the carried OpenMMLab stack
        assert data['torch'].startswith('2.11.0') and data['numpy'] == '2.5.2', data
        assert (data['mmcv'], data['mmseg'], data['mmdet']) == ('2.1.0', '1.2.2', '3.3.0')
        assert data['rows'] and not [r for r in data['rows'] if 'error' in r], data['rows']
    engines = {r['engine'] for r in results['attention']['rows']}
    assert engines == {'nala@eager', 'nala@compiled', 'nala-reference@compiled', 'sdpa@eager',
                       'sdpa@compiled'}
    assert all(r['ms'] > 0 for r in results['attention']['rows'])
    assert set(results['attention']['summary']['sdpa_over_nala']) == {'64', '256'}
    outcomes = {r['outcome'] for r in results['cuda_tests']['rows']}
    assert outcomes == {'PASSED'} and results['cuda_tests']['returncode'] == 0
    assert {(r['model'], r['engine']) for r in results['compiled_training']['rows']} == {
        (m, e) for m in ('nala_t_linear', 'swin_t') for e in ('compiled', 'eager')}
    assert '| compiled_training |' in (out / 'summary.md').read_text()
