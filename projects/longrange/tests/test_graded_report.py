"""The graded sweep's report (projects.longrange.graded, run as its command) on what
is committed beside its plan: the hypothesis, a controlled change validated when read and
reported against its base mixer at the seeds both have run, and an amendment, levels added to
the axis after the plan, reported as such beside the pre-registered regression. The report
(``--report-only``) is built from run files written here in the sweep's format (what the
study's tests in make test-extended produce by training)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

PLAN = {"success": {"metric": "object_mIoU",
                    "threshold_from": "benchmarks/results/studies/longrange.json",
                    "rule": "midpoint"},
        "iters": 50, "val_interval": 25, "rates": {"nala-cosine": 6, "softmax": 2},
        "primary": ["nala-cosine", "softmax"], "secondary": [], "alpha": 0.05,
        "levels_px": [32, 12], "level_seeds": 1, "level_mixers": ["softmax"]}
CHANGE = {"name": "nala-cosine-low-ceiling", "label": "NaLa, cosine kernel, ceiling 3",
          "statement": "the exponent's ceiling decides the misses.",
          "mixer": {"type": "NormAwareLinearAttention", "kernel": "cosine", "lam": 2.0},
          "base": "nala-cosine", "seeds": 5}
LEVEL = dict(exemplar_token_share=0.2, closest_object_px=36, conv_reach_px=32,
             chance_mIoU=55.5, out_of_reach=True)


def write_file(path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def report(plan, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'projects.longrange.graded',
                           '--plan', str(plan), '--out', str(out), '--report-only'], cwd=REPO,
                          capture_output=True, text=True)


def write_md(path, block: dict) -> None:
    path.write_text('# committed\n\n```json\n' + json.dumps(block) + '\n```\n')


def run_file(out, mixer: str, seed: int, object_miou: float, band: int = 32) -> None:
    """A finished run as the sweep's worker writes it (the fields the report reads)."""
    success = object_miou > 65.44
    write_file(out / 'longrange_graded' / 'runs' / f'band{band}' / mixer /
               f'seed{seed:02d}.json',
               dict(mixer=mixer, seed=seed, band=band, iters=50, object_mIoU=object_miou,
                    success=success, crossing_iter=50 if success else None, sec_per_iter=0.1,
                    wall_seconds=180.0 + (seed % 2) * 60,
                    exemplar_mass_match=0.5, loss=[dict(iter=25, loss=0.5)],
                    mixer_stats=[dict(iter=25, grad_norm=0.01, exponent=4.0, saturated=0.5,
                                      negative=0.1)]))


@pytest.fixture
def study(tmp_path):
    plan, out = tmp_path / 'plan.md', tmp_path / 'out'
    write_md(plan, PLAN)
    write_file(out / 'longrange_graded' / 'levels.json', {'32': dict(LEVEL, band=32),
                                                          '12': dict(LEVEL, band=12)})
    return plan, out


def test_without_a_hypothesis_the_report_has_no_such_section(study):
    plan, out = study
    run_file(out, 'nala-cosine', 0, 96.0)
    proc = report(plan, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '## The hypothesis' not in proc.stdout and 'Amendment' not in proc.stdout
    assert 'hypothesis' not in json.loads((out / 'longrange_graded.json').read_text())


@pytest.mark.parametrize('change,message', [
    (dict(seeds=7), "seeds=7; expected 1 to the plan's 6 seeds of base 'nala-cosine'"),
    (dict(base='linear-elu'), "seeds=5; expected 1 to the plan's 0 seeds of base 'linear-elu'"),
    (dict(name='softmax'), "name 'softmax' is a preset's"),
    (dict(statement=None), "missing keys \\['statement'\\]"),
])
def test_a_bad_hypothesis_names_what_is_wrong(study, change, message):
    plan, _ = study
    block = {k: v for k, v in dict(CHANGE, **change).items() if v is not None}
    write_md(plan.parent / 'hypothesis.md', block)
    run_file(study[1], 'nala-cosine', 0, 96.0)
    proc = report(plan, study[1])
    assert proc.returncode != 0
    assert re.search(message, proc.stderr), proc.stderr[-2000:]


def test_the_report_pairs_the_change_with_its_base_seed_by_seed(study):
    plan, out = study
    write_md(plan.parent / 'hypothesis.md', CHANGE)
    base = [96.0, 40.0, 95.0, 41.0, 97.0, 94.0]  # misses at seeds 1 and 3
    for seed, value in enumerate(base):
        run_file(out, 'nala-cosine', seed, value)
    for seed, value in enumerate([95.0, 93.0, 35.0, 92.0]):  # seed 4 not run yet
        run_file(out, 'nala-cosine-low-ceiling', seed, value)
    run_file(out, 'softmax', 0, 30.0, band=12)  # a level where nothing succeeds
    proc = report(plan, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (out / 'longrange_graded.md').read_text()
    saved = json.loads((out / 'longrange_graded.json').read_text())
    test = saved['hypothesis']['test']
    assert [p['seed'] for p in test['pairs']] == [0, 1, 2, 3]  # seed 5: beyond the change
    assert (test['base']['successes'], test['changed']['successes']) == (2, 3)
    assert test['base']['runs'] == test['changed']['runs'] == 4
    assert test['changed']['success_object_mIoU'] == pytest.approx((95 + 93 + 92) / 3)
    assert 0.5 < test['p'] <= 1.0  # 2/4 against 3/4: nothing to see
    assert saved['planned'] == 9  # the plan's 8 runs at band 32 + 1 at band 12
    # the cost: the median of the plan's runs (180 s at even seeds, 240 s at odd ones: four of
    # seven) for the plan's 9 runs and the change's 5, two at a time
    assert saved['cost'] == pytest.approx(dict(run_minutes=3.0, plan_hours=9 * 180 / 2 / 3600,
                                               controlled_minutes=5 * 180 / 2 / 60))
    assert 'No run at band 12 px succeeded' in page and 'band 32 px and' not in page
    assert '4 of 5 run' in page and '| 1 | **40.00** | 93.00 |' in page
    assert "NaLa, cosine kernel, ceiling 3" in page
    assert (out / 'longrange_graded.png').stat().st_size > 10_000  # the difficulty plot
    groups = {(g['mixer'], g['success']) for g in saved['diagnosis']['groups']}
    assert ('nala-cosine-low-ceiling', False) in groups  # the diagnosis reads the change too


AMENDMENT = {"levels_px": [20], "reason": "nothing passes at 12 px: a level between."}


@pytest.mark.parametrize('change,message', [
    (dict(levels_px=[12]), r"levels_px \[12\] are already the plan's levels \[32, 12\]"),
    (dict(levels_px=[6]), r'levels_px=\[6\]; expected distinct band thicknesses of at least 9'),
    (dict(reason=' '), r"reason=' '; expected why the levels were added"),
])
def test_a_bad_amendment_names_what_is_wrong(study, change, message):
    plan, out = study
    write_md(plan.parent / 'amendment.md', dict(AMENDMENT, **change))
    run_file(out, 'nala-cosine', 0, 96.0)
    proc = report(plan, out)
    assert proc.returncode != 0
    assert re.search(message, proc.stderr), proc.stderr[-2000:]


def test_an_amended_level_joins_the_axis_marked_and_fitted_apart(tmp_path):
    plan, out = tmp_path / 'plan.md', tmp_path / 'out'
    write_md(plan, dict(PLAN, level_mixers=['softmax', 'nala-cosine']))
    write_md(tmp_path / 'amendment.md', AMENDMENT)
    write_file(out / 'longrange_graded' / 'levels.json',
               {str(b): dict(LEVEL, band=b, exemplar_token_share=s)
                for b, s in ((32, 0.23), (20, 0.14), (12, 0.09))})
    for seed, value in enumerate([96.0, 95.0, 40.0, 94.0, 97.0, 93.0]):
        run_file(out, 'nala-cosine', seed, value)
    for seed in range(2):
        run_file(out, 'softmax', seed, 97.0)
    for mixer, at_12, at_20 in (('softmax', 30.0, 90.0), ('nala-cosine', 31.0, 33.0)):
        run_file(out, mixer, 0, at_12, band=12)
        run_file(out, mixer, 0, at_20, band=20)
    proc = report(plan, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (out / 'longrange_graded.md').read_text()
    saved = json.loads((out / 'longrange_graded.json').read_text())
    assert saved['planned'] == 10  # the plan's runs alone: 8 at band 32, 2 at band 12
    assert saved['amendment']['planned'] == 2 and len(saved['amendment']['runs']) == 2
    assert 'levels 20 px added after the plan (2 of 2 runs done): nothing passes at 12' in page
    rates = saved['graded']['rates']
    assert (rates['softmax@20']['successes'], rates['nala-cosine@20']['successes']) == (1, 0)
    # the axis thickest first, the amended level marked, in both tables
    assert '| 32 | 23.0 % |' in page and '| 20 (amended) | 14.0 % |' in page
    assert 'band 32: rate [95 %], exemplar mass | band 20 (amended): rate [95 %]' in page
    assert 'No run at band 12 px succeeded' in page and 'band 20 px' not in page
    # the pre-registered regression over the plan's levels, a second one over all of them
    assert saved['graded']['model']['runs'] == 10
    assert saved['graded']['model_amended']['runs'] == 12
    assert "at the plan's levels" in page and 'the amended included' in page
