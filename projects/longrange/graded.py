"""The long-range claim, graded (issue #39): success rates of the token mixers over many seeds,
with intervals and pre-registered exact tests, and a difficulty axis on which spikiness should
matter, the exemplar band's thickness.

Everything it runs is set by the pre-registered plan (``--plan``, by default
results/longrange_graded/plan.md, committed before the runs): the success
threshold, the seeds per mixer, the band thicknesses and the tests. Each run (mixer, seed, band)
is one process that trains through tools/train.py (projects.longrange.study's config, one
thread, validated every ``val_interval`` iterations), measures the stage-1 attention mass its
object queries put on the exemplar over a few validation images, and writes its own JSON under
``OUT/longrange_graded/runs/``; a sweep skips the runs whose JSON is there, so it can be stopped
and resumed at any point, and two run at a time on two cores. Before the runs, each band's data
are generated and its guarantees stored: the exemplar's share of the stage-1 tokens, the
closest object to the band, the control's receptive field and the chance mIoU.

The diagnosis' hypothesis (``hypothesis.md`` beside the plan, committed before its runs once
the diagnosis has formed it) adds its controlled runs: the changed mixer at the base mixer's
seeds, run after the plan's and reported against them. An amendment (``amendment.md`` beside
the plan, committed with its reason before its runs) adds difficulty levels: the plan's axis
mixers at the plan's level seeds, run last, shown on the axis marked as amended and fitted in a
second regression beside the pre-registered one.

The report (``OUT/longrange_graded.{json,md,png}``) is a function of the plan, the hypothesis,
the level facts and the run files alone: an invocation with every run done runs nothing and
rewrites it identically. Statistics: projects.longrange.success_rates. The cost (minutes a run,
hours for the plan, two at a time) is stated in the report, from the runs' own wall times.

    python -m projects.longrange.graded                 # what is not done yet
    python -m projects.longrange.graded --max-runs 20   # then stop (commit, resume)
    python -m projects.longrange.graded --report-only
"""
import argparse
import json
import math
import os
import os.path as osp
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from statistics import mean, median
from typing import Dict, List, Optional

from benchmarks.lib import report
from benchmarks.lib.paths import REPO
from benchmarks.lib.presets import PRESETS
from benchmarks.lib.runs import mixer_sweep_config, tool_env, train_config
from nala_mm.analysis.measure import error_of

from .study import CONFIG_PATH, RESULTS, THREADS, control_reach, per_class_iou, stats_case
from .training_stats import series_mean

NAME = 'longrange_graded'
PLAN = osp.join(RESULTS, NAME, 'plan.md')
WORKERS = 2  # processes at a time: one per core, one thread each
STATS_IMAGES = 8  # validation images whose object rows give a run's exemplar mass
STAGE_1 = 'layers.0.blocks.0.attn'  # the one mixer the task's decoder reads
HYPOTHESIS_FILE = 'hypothesis.md'
AMENDMENT_FILE = 'amendment.md'
# MixerStatsHook's scalars reach scalars.json at the logger's steps: both every 25 iterations
STATS_EVERY = 25
PLANNED_CHANGE = dict(seeds=20)  # the plan's controlled change: at nala-cosine's 20 seeds


# ------------------------------------------------------------------------------ the plan
def json_block(path: str) -> dict:
    """A committed markdown file's machine-readable block (its one ```json fence)."""
    with open(path) as f:
        blocks = re.findall(r'```json\n(.*?)\n```', f.read(), re.S)
    if len(blocks) != 1:
        raise ValueError(f'{path}: expected exactly one ```json block, found {len(blocks)}')
    return json.loads(blocks[0])


def read_plan(path: str = PLAN) -> dict:
    """The pre-registered plan's block."""
    plan = json_block(path)
    unknown = [m for m in [*plan['rates'], *plan['level_mixers']] if m not in PRESETS]
    if unknown:
        raise ValueError(f'{path}: unknown mixers {unknown}; expected names of {list(PRESETS)}')
    return plan


def beside_plan(plan_path: str, name: str) -> str:
    """The hypothesis and the amendment live beside the plan they follow from."""
    return osp.join(osp.dirname(plan_path), name)


def read_hypothesis(plan_path: str, plan: dict) -> Optional[dict]:
    """The diagnosis' hypothesis (``hypothesis.md`` beside the plan, committed before its
    runs), or None before one is formed. Its block names the controlled change as a mixer
    (``name``, ``label``, ``mixer``: the full config), the plan's mixer it changes (``base``)
    and the seeds both run (``seeds``: 0 to seeds - 1, at the task's band)."""
    path = beside_plan(plan_path, HYPOTHESIS_FILE)
    if not osp.exists(path):
        return None
    hypothesis = json_block(path)
    missing = {'name', 'label', 'mixer', 'base', 'seeds', 'statement'} - set(hypothesis)
    if missing:
        raise ValueError(f'{path}: missing keys {sorted(missing)}')
    if hypothesis['name'] in PRESETS:
        raise ValueError(f"{path}: name {hypothesis['name']!r} is a preset's; the controlled "
                         'change needs a name of its own')
    base_seeds = plan['rates'].get(hypothesis['base'], 0)
    if not 0 < hypothesis['seeds'] <= base_seeds:
        raise ValueError(f"{path}: seeds={hypothesis['seeds']}; expected 1 to the plan's "
                         f"{base_seeds} seeds of base {hypothesis['base']!r}, the runs it is "
                         'compared with')
    return hypothesis


def read_amendment(plan_path: str, plan: dict) -> Optional[dict]:
    """The plan's amendment (``amendment.md`` beside it, committed before its runs), or None:
    ``levels_px``, band thicknesses the plan does not hold, run with the plan's axis mixers at
    its level seeds, and ``reason``, why they were added after the plan."""
    from .data import MIN_EXEMPLAR_PX
    path = beside_plan(plan_path, AMENDMENT_FILE)
    if not osp.exists(path):
        return None
    amendment = json_block(path)
    missing = {'levels_px', 'reason'} - set(amendment)
    if missing:
        raise ValueError(f'{path}: missing keys {sorted(missing)}')
    bands = amendment['levels_px']
    if not bands or not all(isinstance(b, int) and b >= MIN_EXEMPLAR_PX for b in bands) or \
            len(set(bands)) != len(bands):
        raise ValueError(f'{path}: levels_px={bands!r}; expected distinct band thicknesses of '
                         f'at least {MIN_EXEMPLAR_PX} px')
    repeated = [b for b in bands if b in plan['levels_px']]
    if repeated:
        raise ValueError(f"{path}: levels_px {repeated} are already the plan's levels "
                         f"{plan['levels_px']}")
    if not isinstance(amendment['reason'], str) or not amendment['reason'].strip():
        raise ValueError(f"{path}: reason={amendment['reason']!r}; expected why the levels "
                         'were added after the plan')
    return amendment


def axis_bands(plan: dict, amendment: Optional[dict]) -> List[int]:
    """Every level of the axis, the plan's and the amendment's, thickest first."""
    return sorted(plan['levels_px'] + (amendment['levels_px'] if amendment else []),
                  reverse=True)


def mixer_config(name: str, hypothesis: Optional[dict]) -> dict:
    """A run's mixer: a preset's, or the hypothesis' controlled change."""
    if hypothesis is not None and name == hypothesis['name']:
        return hypothesis['mixer']
    return PRESETS[name].mixer


def mixer_labels(hypothesis: Optional[dict]) -> Dict[str, str]:
    labels = {m: PRESETS[m].label for m in PRESETS}
    if hypothesis is not None:
        labels[hypothesis['name']] = hypothesis['label']
    return labels


def plan_commit(path: str) -> str:
    """The commit that last changed the plan's text ('uncommitted' when git does not know it).
    A move is not a change: the file is followed across renames that keep its bytes (``-M100%``
    detects only those, ``--diff-filter=AM`` skips them), so the plans committed under
    benchmarks/results/studies/ before the study moved here (#54) keep their commits."""
    inside = osp.relpath(path, REPO)
    if inside.startswith('..'):
        return 'uncommitted'
    proc = subprocess.run(['git', 'log', '-1', '--format=%h', '--follow', '-M100%',
                           '--diff-filter=AM', '--', inside], cwd=REPO,
                          capture_output=True, text=True)
    clean = subprocess.run(['git', 'diff', '--quiet', 'HEAD', '--', inside], cwd=REPO,
                           capture_output=True).returncode == 0
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() and clean \
        else 'uncommitted'


def moved(path: str) -> str:
    """A results path as a plan names it, where the file is now: the committed plan was
    registered when the study's results lived in benchmarks/results/studies/ (they moved to
    projects/longrange/results/ in #54), and a registered plan is not edited."""
    old = 'benchmarks/results/studies/'
    return osp.relpath(osp.join(RESULTS, path[len(old):]), REPO) if path.startswith(old) else path


def success_threshold(plan: dict) -> float:
    """The plan's rule: the midpoint of the calibrated control's and softmax's object mIoU."""
    summary = report.read_json(osp.join(REPO, moved(plan['success']['threshold_from'])))['summary']
    return (summary['identity']['object_mIoU_mean'] + summary['softmax']['object_mIoU_mean']) / 2


@dataclass(frozen=True)
class Run:
    """One training run of the sweep."""
    mixer: str
    seed: int
    band: int

    @property
    def name(self) -> str:
        return f'band{self.band}/{self.mixer}/seed{self.seed:02d}'


def planned_runs(plan: dict) -> List[Run]:
    """Every run of the plan, seeds outermost across the bands (a sweep stopped early holds
    every mixer at every band at its first seeds, so a partial sweep already shows the
    difficulty axis); within a seed, the committed band's mixers first. Level runs at the
    committed band are the success-rate runs."""
    task_band, *other_bands = plan['levels_px']
    runs: List[Run] = []
    for seed in range(max(plan['level_seeds'], *plan['rates'].values())):
        runs += [Run(m, seed, task_band) for m, seeds in plan['rates'].items() if seed < seeds]
        if seed < plan['level_seeds']:
            runs += [Run(m, seed, task_band) for m in plan['level_mixers']
                     if seed >= plan['rates'].get(m, 0)]
            runs += [Run(m, seed, band) for band in other_bands for m in plan['level_mixers']]
    return runs


def controlled_runs(plan: dict, hypothesis: Optional[dict]) -> List[Run]:
    """The hypothesis' runs: its changed mixer at the base's first ``seeds`` seeds."""
    if hypothesis is None:
        return []
    return [Run(hypothesis['name'], seed, plan['levels_px'][0])
            for seed in range(hypothesis['seeds'])]


def amended_runs(plan: dict, amendment: Optional[dict]) -> List[Run]:
    """The amendment's runs: the plan's axis mixers at its level seeds, seeds outermost."""
    if amendment is None:
        return []
    return [Run(m, seed, band) for seed in range(plan['level_seeds'])
            for band in amendment['levels_px'] for m in plan['level_mixers']]


def data_root(band: int) -> str:
    """Each band's data (the task's own band: the long-range study's folder)."""
    from .data import DEFAULT_ROOT, EXEMPLAR_PX
    return DEFAULT_ROOT if band == EXEMPLAR_PX else \
        f'data/longrange/band{band}/ade/ADEChallengeData2016'


# ------------------------------------------------------------------------------ one band
def level_facts(band: int) -> dict:
    """Generate a band's data and measure what the task guarantees there: the exemplar's
    share of the stage-1 tokens (what a flat row puts on it), the closest object to the band,
    the control's receptive field (of the model: the same at every band) and the chance
    mIoU of a model blind to the exemplar."""
    import numpy as np

    from .data import (
        FAR_PX,
        box_distance,
        generate_longrange,
        local_chance_miou,
        sample_scene,
        scene_rng,
    )
    data = generate_longrange(data_root(band), exemplar_px=band)
    shares, closest = [], math.inf
    for index in range(data['num_val']):
        scene = sample_scene(scene_rng(0, 1, index), 128, 128, band)
        y0, x0, y1, x1 = scene.exemplar_box
        centres = (np.arange(32) + 0.5) * 4  # stage 1: stride 4
        inside = ((centres >= y0) & (centres < y1))[:, None] & \
            ((centres >= x0) & (centres < x1))[None, :]
        shares.append(float(inside.mean()))
        closest = min([closest] + [box_distance(o.box, scene.exemplar_box)
                                   for o in scene.objects])
    reach = control_reach()
    return dict(band=band, data_root=data_root(band), exemplar_token_share=mean(shares),
                closest_object_px=int(closest), conv_reach_px=reach, far_px=FAR_PX,
                chance_mIoU=local_chance_miou(data['class_pixel_fraction']),
                out_of_reach=reach < closest)


# ------------------------------------------------------------------------------ one run
def validation_curve(work_dir: str, records: List[dict]) -> List[dict]:
    """Object mIoU at each validation, in order: mmseg logs a per-class table at each, and
    scalars.json has the iteration of each."""
    from .data import LONGRANGE_CLASSES
    tables, current = [], {}
    logs = sorted(osp.join(root, f) for root, _, files in os.walk(work_dir) for f in files
                  if f.endswith('.log'))
    for path in logs:
        with open(path) as f:
            for line in f:
                cells = [c.strip() for c in line.strip().strip('|').split('|')]
                if len(cells) >= 3 and cells[0] in LONGRANGE_CLASSES:
                    try:
                        current[cells[0]] = float(cells[1])
                    except ValueError:
                        continue
                    if set(current) == set(LONGRANGE_CLASSES):
                        tables.append(mean(current[c] for c in LONGRANGE_CLASSES[1:]))
                        current = {}
    steps = [r['step'] for r in records if 'mIoU' in r]
    if len(steps) != len(tables):
        raise RuntimeError(f'{work_dir}: {len(steps)} validations in scalars.json but '
                           f'{len(tables)} per-class tables in the log')
    return [dict(iter=s, object_mIoU=v) for s, v in zip(steps, tables)]


def mixer_series(records: List[dict]) -> List[dict]:
    """The stage-1 mixer's MixerStatsHook scalars over training, one entry per logged step."""
    prefix = f'mixer/backbone.{STAGE_1}/'
    return [dict(iter=r['step'], **{k[len(prefix):]: round(v, 6) for k, v in r.items()
                                    if k.startswith(prefix)})
            for r in records if any(k.startswith(prefix) for k in r)]


def run_one(run: Run, plan: dict, threshold: float, work_root: str,
            hypothesis: Optional[dict] = None) -> dict:
    """Train one run, validate it along the way, measure its exemplar mass."""
    from .data import EXEMPLAR_PX
    root = data_root(run.band)
    text = mixer_sweep_config(CONFIG_PATH, mixer_config(run.mixer, hypothesis), run.seed,
                              plan['iters'], log_every=STATS_EVERY) + (
        f"train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, "
        f"val_interval={plan['val_interval']})\n"
        f"train_dataloader = dict(dataset=dict(data_root={root!r}))\n"
        f"val_dataloader = dict(dataset=dict(data_root={root!r}))\n"
        'test_dataloader = val_dataloader\n'
        # the diagnosis' series: gradient, exponent, saturation, signs of the stage-1 mixer
        f"custom_hooks = [dict(type='RNGStateHook'), dict(type='MixerStatsHook', "
        f"layers=['backbone.{STAGE_1}'], interval={STATS_EVERY})]\n")
    name = f'{run.mixer}_band{run.band}_seed{run.seed}'
    trained = train_config(text, name, work_root)
    if 'error' in trained:
        return dict(asdict(run), error=trained['error'])
    work_dir, records = osp.join(work_root, name), trained['records']
    curve = validation_curve(work_dir, records)
    final = per_class_iou(work_dir)['object_mIoU']
    crossing = next((p['iter'] for p in curve if p['object_mIoU'] > threshold), None)
    times = [r['time'] for r in records if 'time' in r and 'loss' in r]
    result = dict(asdict(run), iters=plan['iters'], object_mIoU=final,
                  mIoU=[r for r in records if 'mIoU' in r][-1]['mIoU'],
                  success=final > threshold, crossing_iter=crossing, curve=curve,
                  loss=[dict(iter=r['step'], loss=round(r['loss'], 5)) for r in records
                        if 'loss' in r],
                  mixer_stats=mixer_series(records),
                  sec_per_iter=mean(times[1:] or times), wall_seconds=trained['wall_seconds'])
    # the stage-1 rows of the objects of a few validation images
    checkpoint = osp.join(work_dir, f"iter_{plan['iters']}.pth")
    layers = []
    for index in range(STATS_IMAGES):
        image = osp.join(root, 'images', 'validation', f'ADE_val_{index:08d}.jpg')
        stats = stats_case(osp.join(work_root, f'{name}.py'), checkpoint, image, 0,
                           exemplar_px=run.band if run.band != EXEMPLAR_PX else None)
        layers += [entry for entry in stats['layers'] if entry['layer'] == STAGE_1]
    for key in ('exemplar_mass_match', 'exemplar_mass_other', 'saturated_share',
                'qnorm_mean'):
        values = [entry[key] for entry in layers if entry.get(key) is not None]
        result[key] = mean(values) if values else None
    return result


def run_path(out: str, run: Run) -> str:
    return osp.join(out, NAME, 'runs', run.name + '.json')


def worker(args: argparse.Namespace) -> None:
    """``--run``: one run in this process, written to its JSON (atomically, so that a stopped
    sweep never leaves a half-written file that counts as done)."""
    import torch
    torch.set_num_threads(THREADS)
    run = Run(**json.loads(args.run))
    plan = read_plan(args.plan)
    hypothesis = read_hypothesis(args.plan, plan)
    os.chdir(REPO)  # data roots are relative to the repository
    with tempfile.TemporaryDirectory(prefix='nala_graded_') as work_root:
        result = run_one(run, plan, success_threshold(plan), work_root, hypothesis)
    if 'error' in result:
        raise SystemExit(f"{run.name}: {result['error']}")
    path = run_path(args.out, run)
    os.makedirs(osp.dirname(path), exist_ok=True)
    report.write_json(path + '.tmp', result)
    os.replace(path + '.tmp', path)


def launch(run: Run, args: argparse.Namespace) -> Optional[str]:
    """One run in a fresh process, one thread; the error line if it failed."""
    env = dict(tool_env(), **{v: str(THREADS) for v in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS',
                                                        'OPENBLAS_NUM_THREADS')})
    proc = subprocess.run([sys.executable, '-m', __spec__.name, '--run', json.dumps(asdict(run)),
                           '--plan', args.plan, '--out', args.out], cwd=REPO, env=env,
                          capture_output=True, text=True)
    return None if proc.returncode == 0 else error_of(proc)


# ------------------------------------------------------------------------------ the report
def load_runs(out: str, runs: List[Run]) -> List[dict]:
    """The finished ones of ``runs``, in their order."""
    return [report.read_json(run_path(out, run)) for run in runs
            if osp.exists(run_path(out, run))]


def rate_row(runs: List[dict]) -> dict:
    """Success count, rate with its Wilson interval, the successes' object mIoU and crossing."""
    from .success_rates import wilson_interval
    won = [r for r in runs if r['success']]
    low, high = wilson_interval(len(won), len(runs))
    return dict(runs=len(runs), successes=len(won), rate=len(won) / len(runs), low=low,
                high=high, success_object_mIoU=mean(r['object_mIoU'] for r in won) if won
                else None,
                crossing_median=median(r['crossing_iter'] for r in won) if won else None,
                exemplar_mass=mean(r['exemplar_mass_match'] for r in runs
                                   if r.get('exemplar_mass_match') is not None)
                if any(r.get('exemplar_mass_match') is not None for r in runs) else None)


def grade(plan: dict, runs: List[dict], levels: Dict[str, dict],
          amendment: Optional[dict] = None) -> dict:
    """Rates per mixer and band, the pre-registered tests (on what has run) and the logistic
    model of success on mixer x level: the plan's, and with an amendment's runs, a second one
    over every level."""
    from .success_rates import barnard_p, holm
    task_band = plan['levels_px'][0]
    rates = {}
    for band in axis_bands(plan, amendment):
        for mixer in dict.fromkeys(r['mixer'] for r in runs):
            chosen = [r for r in runs if r['band'] == band and r['mixer'] == mixer]
            if chosen:
                rates[f'{mixer}@{band}'] = dict(rate_row(chosen), mixer=mixer, band=band)

    def test(a: str, b: str) -> Optional[dict]:
        ra, rb = rates.get(f'{a}@{task_band}'), rates.get(f'{b}@{task_band}')
        if not ra or not rb:
            return None
        return dict(first=a, second=b, counts=[ra['successes'], ra['runs'], rb['successes'],
                                               rb['runs']],
                    p=barnard_p(ra['successes'], ra['runs'], rb['successes'], rb['runs']))
    primary = test(*plan['primary'])
    secondary = [t for t in (test(a, b) for a, b in plan['secondary']) if t]
    for t, adjusted in zip(secondary, holm([t['p'] for t in secondary])):
        t['p_holm'] = adjusted
    planned_levels = {k: v for k, v in levels.items() if int(k) in plan['levels_px']}
    amended = amendment is not None and any(r['band'] in amendment['levels_px'] for r in runs)
    return dict(rates=rates, primary=primary, secondary=secondary,
                model=level_model(plan, runs, planned_levels),
                model_amended=level_model(plan, runs, levels) if amended else None)


def level_model(plan: dict, runs: List[dict], levels: Dict[str, dict]) -> Optional[dict]:
    """Firth logistic regression of success on mixer (indicators, softmax the baseline) x
    log2(exemplar token share) over the axis mixers' runs, and the likelihood-ratio p-value of
    the interaction."""
    import numpy as np

    from .success_rates import firth_logistic, likelihood_ratio_p
    mixers = [m for m in plan['level_mixers'] if m != 'identity']
    chosen = [r for r in runs if r['mixer'] in mixers and str(r['band']) in levels]
    if len({r['band'] for r in chosen}) < 2 or len({r['mixer'] for r in chosen}) < 2:
        return None
    others = [m for m in mixers if m != 'softmax']
    level = np.array([math.log2(levels[str(r['band'])]['exemplar_token_share']) for r in chosen])
    indicators = np.array([[r['mixer'] == m for m in others] for r in chosen], dtype=float)
    x = np.column_stack([np.ones(len(chosen)), indicators, level, indicators * level[:, None]])
    y = np.array([r['success'] for r in chosen], dtype=float)
    interaction = list(range(2 + len(others), x.shape[1]))
    full, reduced = firth_logistic(x, y), firth_logistic(x, y, zero=interaction)
    names = ['intercept', *others, 'level'] + [f'{m} x level' for m in others]
    # to 10 significant digits: the iterative fit's last digits follow the BLAS and the CPU
    # (the committed values moved by 1e-13 on another machine), the report must not
    return dict(terms={n: float(f'{c:.10g}') for n, c in zip(names, full['coef'])},
                runs=len(chosen),
                interaction_p=float(f'{likelihood_ratio_p(full, reduced, len(interaction)):.10g}'))


EARLY_ITERS = 500  # the diagnosis' early phase: before most runs cross the threshold
DIAGNOSIS_STATS = {  # name: (mixer_stats or loss key, iterations it averages over)
    'final loss': ('loss', 'last'), 'gradient norm, early': ('grad_norm', 'early'),
    'gradient norm, late': ('grad_norm', 'last'), 'exponent, final': ('exponent', 'last'),
    'saturated share, final': ('saturated', 'last'),
    'negative share, early': ('negative', 'early'), 'negative share, final': ('negative', 'last')}


def diagnosis(plan: dict, runs: List[dict], mixers: List[str]) -> dict:
    """The plan's exploratory diagnosis: the runs of ``mixers`` (the primary ones, and the
    hypothesis' change once it has run) at the task's band, each summarised from its training
    series (the loss and the stage-1 mixer's MixerStatsHook scalars: mean over the first
    ``EARLY_ITERS`` iterations, or over the last four logged steps), then the median per mixer
    and outcome; the paper's NaLa's misses against its successes, and against the other mixers
    at the same seeds (per run)."""
    chosen = [r for r in runs if r['mixer'] in mixers and r['band'] == plan['levels_px'][0]]

    def summary(run: dict) -> dict:
        row = dict(mixer=run['mixer'], seed=run['seed'], success=run['success'])
        for name, (key, span) in DIAGNOSIS_STATS.items():
            row[name] = series_mean(run['loss'] if key == 'loss' else run['mixer_stats'], key,
                                    **(dict(last=4) if span == 'last'
                                       else dict(until=EARLY_ITERS)))
        return row
    rows = [summary(r) for r in chosen]
    groups = []
    for mixer in mixers:
        for success in (True, False):
            members = [r for r in rows if r['mixer'] == mixer and r['success'] == success]
            if members:
                groups.append(dict(mixer=mixer, success=success, runs=len(members), **{
                    name: median(v) if (v := [m[name] for m in members
                                               if m[name] is not None]) else None
                    for name in DIAGNOSIS_STATS}))
    return dict(runs=rows, groups=groups)


def controlled_test(hypothesis: dict, runs: List[dict], changed: List[dict]) -> dict:
    """The hypothesis' change against its base at the seeds both have run (not part of the
    pre-registered family): success counts, Barnard's exact p, the successes' object mIoU and
    each seed's pair."""
    from .success_rates import barnard_p
    base = {r['seed']: r for r in runs if r['mixer'] == hypothesis['base']
            and r['band'] == changed[0]['band']} if changed else {}
    pairs = [(base[r['seed']], r) for r in changed if r['seed'] in base]
    if not pairs:
        return dict(pairs=[], p=None)
    rows = {side: rate_row([pair[i] for pair in pairs])
            for i, side in enumerate(('base', 'changed'))}
    return dict(rows, p=barnard_p(rows['base']['successes'], len(pairs),
                                  rows['changed']['successes'], len(pairs)),
                pairs=[dict(seed=b['seed'], base=b['object_mIoU'], changed=c['object_mIoU'],
                            base_success=b['success'], changed_success=c['success'])
                       for b, c in pairs])


def fmt_p(value: Optional[float]) -> str:
    return '-' if value is None else (f'{value:.4f}' if value >= 1e-4 else f'{value:.1e}')


def write_outputs(saved: dict, stem: str) -> None:
    report.write_json(stem + '.json', saved)
    graded, plan = saved['graded'], saved['plan']
    labels = mixer_labels(saved.get('hypothesis'))
    task_band = plan['levels_px'][0]
    done = len(saved['runs'])
    lines = ['# The long-range claim, graded', '',
             f"Pre-registered plan: `{saved['plan_path']}` at commit "
             f"{saved['plan_commit']}. {done} of {saved['planned']} planned runs done. A run "
             f"succeeds when its object mIoU after {plan['iters']} iterations is above "
             f"{saved['threshold']:.2f} (the calibration's midpoint); validated every "
             f"{plan['val_interval']} iterations."] + ([
                 f"A run takes {saved['cost']['run_minutes']:.1f} minutes on one thread here "
                 f"(median so far): the plan's runs take {saved['cost']['plan_hours']:.1f} hours "
                 f"{WORKERS} at a time, the diagnosis' controlled change "
                 f"{saved['cost']['controlled_minutes']:.0f} minutes more"
                 + (f", the amendment's {saved['cost']['amendment_minutes']:.0f} minutes more"
                    if 'amendment_minutes' in saved['cost'] else '') + '.']
                 if 'cost' in saved else [])
    amendment = saved.get('amendment')
    if amendment:
        lines += ['', f"Amendment: `{amendment['path']}` at commit {amendment['commit']}, "
                      f"levels {', '.join(f'{b} px' for b in amendment['levels_px'])} added "
                      f"after the plan ({len(amendment['runs'])} of {amendment['planned']} "
                      f"runs done): {amendment['reason']}"]
    lines += ['',
             f'## Success rates (band {task_band} px: the task as committed)', '']
    lines += report.markdown_table(
        ['mixer', 'runs', 'successes', 'rate [Wilson 95 %]', 'object mIoU of the successes',
         'crossing iteration (median)', 'exemplar mass, matching objects'],
        [[labels[r['mixer']], r['runs'], r['successes'],
          f"{r['rate']:.2f} [{r['low']:.2f}, {r['high']:.2f}]",
          report.fmt(r['success_object_mIoU'], 2), report.fmt(r['crossing_median'], 0),
          report.fmt(r['exemplar_mass'] and 100 * r['exemplar_mass'], 1) + ' %']
         for r in graded['rates'].values() if r['band'] == task_band])
    lines += ['', '## Tests (Barnard, two-sided)', '']
    tests = ([dict(graded['primary'], kind='primary')] if graded['primary'] else []) + \
        [dict(t, kind='secondary') for t in graded['secondary']]
    lines += report.markdown_table(
        ['test', 'comparison', 'successes / runs', 'p', 'p (Holm)'],
        [[t['kind'], f"{t['first']} vs {t['second']}",
          f"{t['counts'][0]}/{t['counts'][1]} vs {t['counts'][2]}/{t['counts'][3]}",
          fmt_p(t['p']), fmt_p(t.get('p_holm'))] for t in tests])
    lines += ['', '## The difficulty axis: the exemplar band\'s thickness', '']
    bands = axis_bands(plan, amendment)
    amended = amendment['levels_px'] if amendment else []

    def band_name(band: int) -> str:
        return f'{band} (amended)' if band in amended else str(band)
    axis_runs = saved['runs'] + (amendment['runs'] if amendment else [])
    lines += report.markdown_table(
        ['band px', 'exemplar token share', 'closest object px', 'control reach px',
         'chance mIoU', 'out of reach'],
        [[band_name(f['band']), f"{100 * f['exemplar_token_share']:.1f} %",
          f['closest_object_px'], f['conv_reach_px'], f"{f['chance_mIoU']:.2f}",
          'yes' if f['out_of_reach'] else 'NO']
         for f in sorted(saved['levels'].values(), key=lambda f: -f['band'])])
    lines += ['']
    lines += report.markdown_table(
        ['mixer', *[f'band {band_name(b)}: rate [95 %], exemplar mass' for b in bands]],
        [[labels[m]] + [(lambda r: '-' if r is None else
                         f"{r['successes']}/{r['runs']} [{r['low']:.2f}, {r['high']:.2f}], "
                         f"{report.fmt(r['exemplar_mass'] and 100 * r['exemplar_mass'], 1)} %")(
                            graded['rates'].get(f'{m}@{b}')) for b in bands]
         for m in plan['level_mixers']])
    floor = [b for b in bands if any(r['band'] == b for r in axis_runs)
             and not any(r['success'] for r in axis_runs if r['band'] == b)]
    if floor:  # a level nothing passes measures the budget, not the mixers
        lines += ['', f"No run at band {' and '.join(f'{b} px' for b in floor)} succeeded, "
                      'softmax\'s included: there the level is at the floor of the task at '
                      'this budget and cannot separate the mixers. The regression below includes '
                      'those runs, so its interaction mostly contrasts the other levels with '
                      'that floor.']
    for model, scope in ((graded['model'], "the plan's levels"),
                         (graded.get('model_amended'), 'every level, the amended included '
                                                       '(outside the pre-registration)')):
        if model:
            lines += ['', f"Firth logistic regression over {model['runs']} runs at {scope}, "
                          'success on mixer x log2(exemplar token share), softmax the baseline: '
                          f"interaction (likelihood ratio) p = {fmt_p(model['interaction_p'])}.",
                      '']
            lines += report.markdown_table(['term', 'coefficient'],
                                           [[k, f'{v:+.3f}'] for k, v in model['terms'].items()])
    lines += ['', "## Diagnosis (exploratory): the paper's NaLa, missing against succeeding", '',
              f"The primary mixers' runs at band {task_band}, summarised from their training "
              f'series: early = mean over the first {EARLY_ITERS} iterations, otherwise over the '
              "last four logged steps; the stage-1 mixer's scalars (MixerStatsHook). Median per "
              'mixer and outcome:', '']
    names = list(DIAGNOSIS_STATS)
    lines += report.markdown_table(
        ['mixer', 'outcome', 'runs', *names],
        [[labels[g['mixer']], 'success' if g['success'] else 'miss', g['runs'],
          *[report.fmt(g[n], 4) for n in names]] for g in saved['diagnosis']['groups']])
    lines += ['', 'Per run (the same seeds side by side):', '']
    lines += report.markdown_table(
        ['seed', 'mixer', 'success', *names],
        [[r['seed'], r['mixer'], 'yes' if r['success'] else 'no',
          *[report.fmt(r[n], 4) for n in names]]
         for r in sorted(saved['diagnosis']['runs'], key=lambda r: (r['seed'], r['mixer']))])
    lines += ['', '## Runs', '']
    lines += report.markdown_table(
        ['band', 'mixer', 'seed', 'object mIoU', 'success', 'crossing', 'exemplar mass',
         's / iter'],
        [[r['band'], r['mixer'], r['seed'], f"{r['object_mIoU']:.2f}",
          'yes' if r['success'] else 'no', report.fmt(r['crossing_iter'], 0),
          report.fmt(r['exemplar_mass_match'] and 100 * r['exemplar_mass_match'], 1),
          f"{r['sec_per_iter']:.3f}"] for r in axis_runs])
    if 'hypothesis' in saved:
        lines[lines.index('## Runs'):lines.index('## Runs')] = hypothesis_lines(
            saved['hypothesis'], labels) + ['']
    report.write_markdown(stem + '.md', lines)
    plot(saved, stem + '.png')


def hypothesis_lines(hypothesis: dict, labels: Dict[str, str]) -> List[str]:
    """The report's section on the hypothesis and its controlled change."""
    test = hypothesis['test']
    lines = ['## The hypothesis, tested with a controlled change', '',
             f"`{hypothesis['path']}` at commit {hypothesis['commit']}: "
             f"{hypothesis['statement']}", '',
             f"{labels[hypothesis['base']]} against {labels[hypothesis['name']]} "
             f"(`{json.dumps(hypothesis['mixer'])}`) at the same seeds, "
             f"{len(test['pairs'])} of {hypothesis['seeds']} run; Barnard's exact test, "
             f"two-sided, outside the pre-registered family: p = {fmt_p(test['p'])}.", '']
    if test['pairs']:
        lines += report.markdown_table(
            ['mixer', 'successes / runs', 'rate [Wilson 95 %]', 'object mIoU of the successes',
             'crossing iteration (median)', 'exemplar mass, matching objects'],
            [[labels[hypothesis[side]], f"{r['successes']}/{r['runs']}",
              f"{r['rate']:.2f} [{r['low']:.2f}, {r['high']:.2f}]",
              report.fmt(r['success_object_mIoU'], 2), report.fmt(r['crossing_median'], 0),
              report.fmt(r['exemplar_mass'] and 100 * r['exemplar_mass'], 1) + ' %']
             for side, r in (('base', test['base']), ('name', test['changed']))])
        lines += ['', 'Per seed, object mIoU (a miss in bold):', '']
        lines += report.markdown_table(
            ['seed', hypothesis['base'], hypothesis['name']],
            [[p['seed']] + [f"{p[side]:.2f}" if p[side + '_success'] else f"**{p[side]:.2f}**"
                            for side in ('base', 'changed')] for p in test['pairs']])
    return lines


def plot(saved: dict, path: str) -> None:
    """Success rate (Wilson bars) and exemplar mass against the exemplar's token share, one
    line per axis mixer."""
    plt = report.pyplot()
    plan, rates, levels = saved['plan'], saved['graded']['rates'], saved['levels']
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mixer in plan['level_mixers']:
        points = [(100 * levels[str(b)]['exemplar_token_share'], rates[f'{mixer}@{b}'])
                  for b in axis_bands(plan, saved.get('amendment'))
                  if f'{mixer}@{b}' in rates and str(b) in levels]
        if not points:
            continue
        shares, rows = zip(*points)
        label = PRESETS[mixer].label
        left.errorbar(shares, [r['rate'] for r in rows],
                      yerr=[[r['rate'] - r['low'] for r in rows],
                            [r['high'] - r['rate'] for r in rows]],
                      marker='o', capsize=3, label=label)
        masses = [(s, r['exemplar_mass']) for s, r in points if r['exemplar_mass'] is not None]
        if masses:
            right.plot(*zip(*[(s, 100 * m) for s, m in masses]), marker='o', label=label)
    for ax, ylabel in ((left, 'success rate (Wilson 95 %)'),
                       (right, 'stage-1 row mass on the exemplar, matching objects (%)')):
        ax.set_xscale('log')
        ax.set_xlabel('exemplar share of the stage-1 tokens (%)')
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    left.legend(fontsize=7, loc='best')
    fig.suptitle('long-range exemplar task: success against the far signal\'s share')
    report.save_figure(fig, path)


def shown_path(path: str) -> str:
    inside = osp.relpath(path, REPO)
    return path if inside.startswith('..') else inside


def write_report(args: argparse.Namespace, plan: dict, levels: Dict[str, dict]) -> str:
    hypothesis = read_hypothesis(args.plan, plan)
    amendment = read_amendment(args.plan, plan)
    runs = load_runs(args.out, planned_runs(plan))
    changed = load_runs(args.out, controlled_runs(plan, hypothesis))
    amended = load_runs(args.out, amended_runs(plan, amendment))
    diagnosed = plan['primary'] + ([hypothesis['name']] if hypothesis else [])
    saved = dict(plan=plan, plan_path=shown_path(args.plan), plan_commit=plan_commit(args.plan),
                 threshold=success_threshold(plan), planned=len(planned_runs(plan)),
                 levels=levels, runs=runs, graded=grade(plan, runs + amended, levels, amendment),
                 diagnosis=diagnosis(plan, runs + changed, diagnosed))
    if runs:  # the cost stated up front, from the runs so far
        seconds = median(r['wall_seconds'] for r in runs)  # runs beside other work: outliers
        saved['cost'] = dict(run_minutes=seconds / 60,
                             plan_hours=saved['planned'] * seconds / WORKERS / 3600,
                             controlled_minutes=(hypothesis or PLANNED_CHANGE)['seeds'] *
                             seconds / WORKERS / 60)
        if amendment:
            saved['cost']['amendment_minutes'] = len(amended_runs(plan, amendment)) * \
                seconds / WORKERS / 60
    if amendment:
        path = beside_plan(args.plan, AMENDMENT_FILE)
        saved['amendment'] = dict(amendment, path=shown_path(path), commit=plan_commit(path),
                                  planned=len(amended_runs(plan, amendment)), runs=amended)
    if hypothesis:
        path = beside_plan(args.plan, HYPOTHESIS_FILE)
        saved['hypothesis'] = dict(hypothesis, path=shown_path(path), commit=plan_commit(path),
                                   runs=changed, test=controlled_test(hypothesis, runs, changed))
    stem = osp.join(args.out, NAME)
    write_outputs(saved, stem)
    return stem + '.md'


# ------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--plan', default=PLAN, help='the pre-registered plan (markdown with '
                        'one ```json block)')
    parser.add_argument('--out', default=RESULTS)
    parser.add_argument('--max-runs', type=int, help='stop after this many new runs')
    parser.add_argument('--run', help=argparse.SUPPRESS)  # one run, in a worker process
    report.add_report_only_argument(parser, NAME)
    args = parser.parse_args()
    args.plan, args.out = osp.abspath(args.plan), osp.abspath(args.out)
    if args.run:
        worker(args)
        return
    plan = read_plan(args.plan)
    levels_path = osp.join(args.out, NAME, 'levels.json')
    if args.report_only:
        print(open(write_report(args, plan, report.read_json(levels_path))).read())
        return
    os.chdir(REPO)
    import torch
    torch.set_num_threads(THREADS)
    levels = report.read_json(levels_path) if osp.exists(levels_path) else {}
    amendment = read_amendment(args.plan, plan)
    for band in axis_bands(plan, amendment):  # data and guarantees first (none in parallel)
        if str(band) not in levels:
            levels[str(band)] = level_facts(band)
        else:  # the data are needed even when their facts are stored
            from .data import generate_longrange
            generate_longrange(data_root(band), exemplar_px=band)
    os.makedirs(osp.dirname(levels_path), exist_ok=True)
    report.write_json(levels_path, levels)
    pending = [r for r in planned_runs(plan) + controlled_runs(plan, read_hypothesis(
        args.plan, plan)) + amended_runs(plan, amendment)
        if not osp.exists(run_path(args.out, r))]
    pending = pending[:args.max_runs] if args.max_runs is not None else pending
    from tqdm import tqdm
    failures = []
    with ThreadPoolExecutor(WORKERS) as pool, tqdm(total=len(pending),
                                                   desc='graded long-range runs') as bar:
        futures = {pool.submit(launch, run, args): run for run in pending}
        for future in as_completed(futures):
            error = future.result()
            if error:
                failures.append(f'{futures[future].name}: {error}')
                bar.write(f'FAILED {failures[-1]}')
            bar.update()
            write_report(args, plan, levels)  # partial results after every run
    print(open(write_report(args, plan, levels)).read())
    if failures:
        raise SystemExit(f'{len(failures)} runs failed (run again to retry them):\n' +
                         '\n'.join(failures))


if __name__ == '__main__':
    main()
