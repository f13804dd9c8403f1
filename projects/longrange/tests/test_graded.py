"""The graded long-range sweep (projects.longrange.graded) on a tiny plan: it runs what
is missing and only that, two at a time, a stopped sweep resumes, a finished one runs nothing
and rewrites its report byte for byte, and each run's JSON holds its validation curve and its
stage-1 mixer's series. Real training runs (tools/train.py): make test-extended."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.extended]
REPO = Path(__file__).resolve().parents[3]
PLAN = {"success": {"metric": "object_mIoU",
                    "threshold_from": "benchmarks/results/studies/longrange.json",
                    "rule": "midpoint"},
        "iters": 100, "val_interval": 50, "rates": {"softmax": 1, "identity": 1},
        "primary": ["softmax", "identity"], "secondary": [], "alpha": 0.05,
        "levels_px": [32, 12], "level_seeds": 1, "level_mixers": ["softmax", "identity"]}


def sweep(plan: Path, out: Path, *extra: str) -> str:
    proc = subprocess.run([sys.executable, '-m', 'projects.longrange.graded',
                           '--plan', str(plan), '--out', str(out), *extra], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_sweep_resumes_and_a_finished_one_runs_nothing(tmp_path):
    plan, out = tmp_path / 'plan.md', tmp_path / 'out'
    plan.write_text('# tiny plan\n```json\n' + json.dumps(PLAN) + '\n```\n')
    runs = out / 'longrange_graded' / 'runs'
    assert '2 of 4 planned runs done' in sweep(plan, out, '--max-runs', '2')
    assert len(list(runs.rglob('*.json'))) == 2
    assert '4 of 4 planned runs done' in sweep(plan, out)
    page, data = (out / 'longrange_graded.md').read_bytes(), \
        (out / 'longrange_graded.json').read_bytes()
    files = {p: p.stat().st_mtime_ns for p in runs.rglob('*.json')}
    sweep(plan, out)  # everything done: nothing runs, the report is the same
    assert {p: p.stat().st_mtime_ns for p in runs.rglob('*.json')} == files
    assert (out / 'longrange_graded.md').read_bytes() == page
    assert (out / 'longrange_graded.json').read_bytes() == data
    sweep(plan, out, '--report-only')
    assert (out / 'longrange_graded.md').read_bytes() == page

    run = json.loads((runs / 'band12' / 'softmax' / 'seed00.json').read_text())
    assert [p['iter'] for p in run['curve']] == [50, 100]
    # the mixer's scalars reach the log at the logger's steps: the sweep logs every 25
    # iterations (a quarter of these runs), as often as MixerStatsHook measures
    assert [p['iter'] for p in run['mixer_stats']] == [25, 50, 75, 100]
    assert all(p['grad_norm'] > 0 and p['negative'] == 0 for p in run['mixer_stats'])
    assert run['success'] == (run['object_mIoU'] > json.loads(data)['threshold'])
    levels = json.loads((out / 'longrange_graded' / 'levels.json').read_text())
    assert levels['12']['exemplar_token_share'] < levels['32']['exemplar_token_share'] / 2
    assert all(level['out_of_reach'] for level in levels.values())

    (runs / 'band32' / 'identity' / 'seed00.json').unlink()  # one run lost: only it reruns
    sweep(plan, out)
    assert {p for p in runs.rglob('*.json')} == set(files)
    assert [p for p, t in files.items() if p.stat().st_mtime_ns != t] == \
        [runs / 'band32' / 'identity' / 'seed00.json']
