"""What every benchmark script shares: measuring (peak memory above a baseline, median and
interleaved times), one case per process, the size sweep with its command line, and the writers
of the results (JSON, a markdown table, a plot).

A sweep script (backbone.py, segmentor.py) defines its models and a ``make_step(name, side,
mode, batch, device)`` that returns one call to time, then calls :func:`sweep_cli`. Modes:

* ``fwd``: eval mode, ``torch.no_grad``, batch 1 (inference);
* ``train``: train mode, forward + backward of the loss (parameter gradients are part of the
  step's memory, optimizer state is not), batch ``--train-batch``.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time
from statistics import median
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

RESULTS = osp.join(osp.dirname(osp.abspath(__file__)), 'results')
MODES = ('fwd', 'train')
MODE_TITLES = {'fwd': 'inference (no grad)', 'train': 'training step (forward + backward)'}
Step = Callable[[], None]


# ------------------------------------------------------------------------------ measuring
def _status_kib(field: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


def peak_memory_mib(step: Step, device: str) -> float:
    """Peak memory of one ``step()`` above what was held before it.

    CPU: the resident-set high-water mark (VmHWM), reset through /proc/self/clear_refs; run
    the process with MALLOC_MMAP_THRESHOLD_ set (see :func:`spawn`) so freed blocks go back to
    the OS at once. GPU: the caching allocator's own peak counter.
    """
    if device == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # resets VmHWM to the current RSS
    base = _status_kib('VmRSS')
    step()
    return (_status_kib('VmHWM') - base) / 1024


def median_ms(step: Step, repeats: int, device: str, warmup: int = 1) -> float:
    for _ in range(warmup):
        step()
    times: List[float] = []
    for _ in range(repeats):
        if device == 'cuda':
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            step()
            times.append((time.perf_counter() - start_s) * 1e3)
    return median(times)


def interleaved_ms(steps: Dict[str, Step], repeats: int, warmup: int = 1,
                   device: str = 'cpu') -> Dict[str, List[float]]:
    """Wall times of several engines doing the same work, taken in turns.

    Each round times every engine once, so drift in a shared machine's load reaches all of them
    alike; compare per-round ratios or medians, not single calls.
    """
    def sync() -> None:
        if device == 'cuda':
            torch.cuda.synchronize()

    for _ in range(warmup):
        for step in steps.values():
            step()
    times: Dict[str, List[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            sync()
            start_s = time.perf_counter()
            step()
            sync()
            times[name].append((time.perf_counter() - start_s) * 1e3)
    return times


def in_turns(steps: Dict[str, Step], reference: str, repeats: int, warmup: int,
             device: str) -> Dict[str, dict]:
    """Every model's median and best time from rounds taken in turns in one process, and its
    time ratio to ``reference`` as the median of the per-round ratios (robust to load drift:
    both calls of a round see the same machine)."""
    times = interleaved_ms(steps, repeats, warmup, device)
    result = {}
    for name, mine in times.items():
        result[name] = dict(median_ms=median(mine), best_ms=min(mine), times_ms=mine)
        if reference in times:
            result[name]['ms_ratio'] = median(a / b for a, b in zip(mine, times[reference]))
    return result


def measure(step: Step, what: str, repeats: int, warmup: int, device: str) -> dict:
    """Peak memory of one ``step`` or its median time, after ``warmup`` steps (so one-time
    allocations such as kernel caches and gradient buffers are part of the baseline)."""
    if what == 'memory':
        for _ in range(warmup):
            step()
        return dict(peak_mib=peak_memory_mib(step, device))
    return dict(median_ms=median_ms(step, repeats, device, warmup=warmup), repeats=repeats)


def device_name(device: str) -> str:
    if device == 'cuda':
        return torch.cuda.get_device_name()
    threads = torch.get_num_threads()
    return f'CPU, {threads} thread{"s" if threads > 1 else ""}'


# ------------------------------------------------------------------------------ processes
def spawn(script: str, args: List[str], memory: bool, timeout: int = 3600) -> dict:
    """Run ``script --case *args`` in a fresh process; it prints one JSON line last."""
    env = dict(os.environ)
    if memory:
        env['MALLOC_MMAP_THRESHOLD_'] = '65536'  # large frees go back to the OS at once
    try:
        proc = subprocess.run([sys.executable, script, '--case', *args], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f'timeout after {timeout} s')
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return dict(error=lines[-1] if lines else f'exit code {proc.returncode}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train_config(config_text: str, name: str, work_root: str) -> dict:
    """Write ``config_text`` to ``work_root/name.py`` and train it through tools/train.py in a
    fresh process (a study's runs must not share state). Returns ``records`` (every line of the
    run's scalars.json: training logs and evaluation metrics) and ``wall_seconds``, or ``error``
    (the last line of the run's stderr)."""
    repo = osp.dirname(osp.dirname(osp.abspath(__file__)))
    work_dir, config = osp.join(work_root, name), osp.join(work_root, f'{name}.py')
    with open(config, 'w') as f:
        f.write(config_text)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, osp.join(repo, 'tools', 'train.py'), config,
                           '--work-dir', work_dir], cwd=repo, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=repo, PYTHONWARNINGS='ignore'))
    wall = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return dict(error=lines[-1] if lines else f'exit code {proc.returncode}')
    records = []
    for root, _, files in os.walk(work_dir):
        if 'scalars.json' in files:
            with open(osp.join(root, 'scalars.json')) as f:
                records += [json.loads(line) for line in f if line.strip()]
    return dict(records=records, wall_seconds=wall)


# The token mixers the comparisons train (ablation.py on the demo data, longrange.py): name ->
# a label for tables and the mixer config that goes in every stage.
MIXER_VARIANTS: Dict[str, dict] = {
    'nala-cosine': dict(label="NaLa, paper's cosine kernel",
                        mixer=dict(type='NormAwareLinearAttention', kernel='cosine')),
    'nala-relu': dict(label='NaLa, released ReLU kernel',
                      mixer=dict(type='NormAwareLinearAttention', kernel='relu')),
    'nala-fixed-power': dict(label='NaLa without norm awareness (cosine kernel, p = 3)',
                             mixer=dict(type='NormAwareLinearAttention', kernel='cosine',
                                        norm_aware=False)),
    'nala-positive': dict(label='NaLa, positive-only kernel',
                          mixer=dict(type='NormAwareLinearAttention', kernel='positive')),
    'linear-relu': dict(label='plain linear attention (ReLU)',
                        mixer=dict(type='LinearAttention', feature_map='relu')),
    'linear-elu': dict(label='plain linear attention (1 + ELU)',
                       mixer=dict(type='LinearAttention', feature_map='elu')),
    'softmax': dict(label='softmax attention', mixer=dict(type='SoftmaxAttention')),
    'identity': dict(label='control: no token mixing', mixer=dict(type='IdentityAttention')),
    # an exponent that stays responsive where tanh ||q|| saturates (docs/longrange.md)
    'nala-rms': dict(label='NaLa, exponent reads ‖q‖/√d (cosine kernel)',
                     mixer=dict(type='NormAwareLinearAttention', kernel='cosine',
                                query_norm='rms')),
}


MIXER_SWEEP_CONFIG = """_base_ = [{base!r}]
model = dict(backbone=dict(mixers=[{mixer!r}] * 4))
randomness = dict(seed={seed})
max_iters = {iters}
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end={warmup}),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin={warmup}, end=max_iters, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(logger=dict(type='LoggerHook', interval={log_interval},
                                log_metric_by_epoch=False),
                     checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters,
                                     max_keep_ckpts=1))
"""


def mixer_sweep_config(base: str, mixer: dict, seed: int, iters: int,
                       log_every: int = 50) -> str:
    """A config that trains ``base`` with ``mixer`` in all four stages for ``iters`` iterations
    (warm-up over the first tenth, then poly decay), seeded, evaluated and saved once at the
    end: one run of a mixer comparison (ablation.py, longrange.py)."""
    return MIXER_SWEEP_CONFIG.format(base=base, mixer=mixer, seed=seed, iters=iters,
                                     warmup=max(iters // 10, 1),
                                     log_interval=max(min(log_every, iters // 4), 1))


# ------------------------------------------------------------------------------ writers
def write_json(path: str, payload: dict) -> None:
    with open(path, 'w') as f:
        json.dump(payload, f, indent=2)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    return ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)] + \
        ['| ' + ' | '.join(map(str, row)) + ' |' for row in rows]


def write_markdown(path: str, lines: Sequence[str]) -> None:
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def log_log_axes(ax, title: str, xlabel: str) -> None:
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, which='both', alpha=0.3)


def pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def seed_scatter(ax, runs: Sequence[dict], summary: Dict[str, dict], rotation: int = 15) -> None:
    """Every run's mIoU per variant (dots) with the variant's mean and std beside them: the
    picture of a mixer comparison over seeds (ablation.py, longrange.py)."""
    from statistics import mean, stdev
    names = list(summary)
    for i, variant in enumerate(names):
        values = [r['mIoU'] for r in runs if r['variant'] == variant and 'mIoU' in r]
        ax.scatter([i] * len(values), values, color='#4c72b0', zorder=3)
        if values:
            ax.errorbar(i + 0.15, mean(values), yerr=stdev(values) if len(values) > 1 else 0,
                        fmt='s', color='#dd8452', capsize=4, zorder=3)
    ax.set_xticks(range(len(names)), [summary[n]['label'] for n in names], rotation=rotation,
                  ha='right', fontsize=8)


def fmt(value: Optional[float], digits: int = 1) -> str:
    return '-' if value is None else f'{value:.{digits}f}'


# ------------------------------------------------------------------------------ size sweeps
def run_cases(script: str, models: Dict[str, dict], plan: Dict[str, Sequence[int]],
              batches: Dict[str, int], repeats: int, warmup: int, device: str,
              timeout: int) -> List[dict]:
    """Every (mode, side) of ``plan``: each model's peak memory in a fresh process of its own
    (a high-water mark needs one), then all models timed in turns in one more process
    (:func:`in_turns`), so that the time ratios compare calls made under the same load."""
    from tqdm import tqdm
    cases = [(mode, side) for mode, sides in plan.items() for side in sides]
    rows = []
    progress = tqdm(cases, desc=osp.basename(script))
    for mode, side in progress:
        progress.set_postfix_str(f'{mode} {side}x{side}')
        mine = []
        for name in models:
            case = [name, side, mode, batches[mode], repeats, warmup, device]
            memory = spawn(script, [*map(str, case), 'memory'], memory=True, timeout=timeout)
            row = dict(model=name, mode=mode, side=side, pixels=side * side, batch=batches[mode],
                       mib=memory.get('peak_mib'))
            if 'error' in memory:
                row['error'] = memory['error']
            mine.append(row)
        # a model that ran out of memory once is not timed
        timed = [row['model'] for row in mine if 'error' not in row]
        case = ['+'.join(timed), side, mode, batches[mode], repeats, warmup, device, 'turns']
        timing = spawn(script, list(map(str, case)), memory=False,
                       timeout=timeout * len(timed)) if timed else {}
        for row in mine:
            result = timing.get(row['model'], {})
            row.update(ms=result.get('median_ms'), ms_best=result.get('best_ms'),
                       ms_ratio=result.get('ms_ratio'), times_ms=result.get('times_ms'))
            if 'error' in timing and 'error' not in row:
                row['error'] = timing['error']
        rows += mine
    return rows


def fit_exponent(rows: List[dict], model: str, mode: str, key: str) -> Optional[float]:
    """Slope of log(value) vs log(pixels): ~1 linear, ~2 quadratic in the pixel count."""
    points = [(r['pixels'], r[key]) for r in rows
              if r['model'] == model and r['mode'] == mode and (r.get(key) or 0) > 0]
    if len(points) < 2:
        return None
    pixels, values = np.log(np.array(points, dtype=float)).T
    return float(np.polyfit(pixels, values, 1)[0])


def add_memory_ratios(rows: List[dict], reference: str) -> None:
    """``mib_ratio``: each row's peak memory against the reference model's at the same mode
    and size (< 1 = lighter). Time ratios come from the rounds in turns (:func:`in_turns`)."""
    for row in rows:
        ref = next((r for r in rows if r['model'] == reference and r['mode'] == row['mode']
                    and r['side'] == row['side']), {})
        value, base = row.get('mib'), ref.get('mib')
        row['mib_ratio'] = None if value is None or not base else value / base


def sweep_report(rows: List[dict], models: Dict[str, dict], reference_label: str,
                 header: List[str]) -> List[str]:
    lines = list(header)
    for mode in MODES:
        mine = [r for r in rows if r['mode'] == mode]
        if not mine:
            continue
        batch = mine[0]['batch']
        lines += ['', f'## {MODE_TITLES[mode]}, batch {batch}', '']
        lines += markdown_table(
            ['model', 'side', 'median ms', 'best ms', f'time / {reference_label}', 'peak MiB',
             f'memory / {reference_label}', 'error'],
            [[models[r['model']]['label'], r['side'], fmt(r['ms']), fmt(r.get('ms_best')),
              fmt(r['ms_ratio'], 2), fmt(r['mib']), fmt(r['mib_ratio'], 2),
              r.get('error', '')] for r in mine])
    lines += ['', '## Cost exponents (log-log least-squares slope vs pixels; 1 = linear, '
                  '2 = quadratic)', '']
    fit_rows = []
    for name, spec in models.items():
        for mode in MODES:
            time_fit = fit_exponent(rows, name, mode, 'ms')
            memory_fit = fit_exponent(rows, name, mode, 'mib')
            if time_fit is not None or memory_fit is not None:
                fit_rows.append([spec['label'], mode, fmt(time_fit, 2), fmt(memory_fit, 2)])
    lines += markdown_table(['model', 'mode', 'time', 'memory'], fit_rows)
    return lines


def sweep_plot(rows: List[dict], models: Dict[str, dict], path: str) -> None:
    plt = pyplot()
    modes = [m for m in MODES if any(r['mode'] == m for r in rows)]
    fig, axes = plt.subplots(len(modes), 2, figsize=(11, 4.2 * len(modes)), squeeze=False)
    for mode, (ax_time, ax_mem) in zip(modes, axes):
        for name, spec in models.items():
            mine = [r for r in rows if r['model'] == name and r['mode'] == mode]
            for ax, key in ((ax_time, 'ms'), (ax_mem, 'mib')):
                points = [(r['pixels'], r[key]) for r in mine if (r.get(key) or 0) > 0]
                if points:
                    ax.plot(*zip(*points), marker='o', label=spec['label'])
        log_log_axes(ax_time, f'{MODE_TITLES[mode]}: time (ms)', 'pixels')
        log_log_axes(ax_mem, f'{MODE_TITLES[mode]}: peak memory (MiB)', 'pixels')
        ax_time.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def sweep_cli(script: str, doc: str, stem: str, models: Dict[str, dict],
              make_step: Callable[[str, int, str, int, str], Step], reference: str,
              default_sizes: Dict[str, Sequence[int]], description: str) -> None:
    """Command line of a size sweep: ``--case`` (child: one measurement) or the sweep (parent:
    JSON, markdown and plot under ``--out``, ``STEM_cuda.*`` on a GPU)."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--case', nargs=8, help=argparse.SUPPRESS)
    parser.add_argument('--sizes', nargs='*', type=int, default=list(default_sizes['fwd']),
                        help='square input sides of the inference mode (none: skip it)')
    parser.add_argument('--train-sizes', nargs='*', type=int,
                        default=list(default_sizes['train']),
                        help='square crop sides of the training-step mode (none: skip it)')
    parser.add_argument('--train-batch', type=int, default=2)
    parser.add_argument('--models', nargs='+', choices=list(models), default=list(models))
    parser.add_argument('--repeats', type=int, default=3, help='timed rounds in turns (median)')
    parser.add_argument('--warmup', type=int, default=1, help='untimed runs before timing')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--timeout', type=int, default=3600, help='seconds per measurement')
    parser.add_argument('--out', default=RESULTS, help='output folder')
    args = parser.parse_args()
    if args.case:
        name, side, mode, batch, repeats, warmup, device, what = args.case
        torch.manual_seed(0)
        if what == 'turns':
            steps = {n: make_step(n, int(side), mode, int(batch), device)
                     for n in name.split('+')}
            print(json.dumps(in_turns(steps, reference, int(repeats), int(warmup), device)))
            return
        step = make_step(name, int(side), mode, int(batch), device)
        print(json.dumps(measure(step, what, int(repeats), int(warmup), device)))
        return

    chosen = {name: models[name] for name in args.models}
    plan = {'fwd': args.sizes, 'train': args.train_sizes}
    rows = run_cases(script, chosen, plan, {'fwd': 1, 'train': args.train_batch},
                     args.repeats, args.warmup, args.device, args.timeout)
    add_memory_ratios(rows, reference)
    header = [f'# {description} ({device_name(args.device)})', '',
              f'torch {torch.__version__}; time: the models at one mode and size timed in turns '
              f'in one process, {args.repeats} rounds after {args.warmup} warm-up round(s); '
              f'time / {models[reference]["label"]} = median of the per-round ratios (both calls '
              'of a round see the same load). Memory: peak of one step after the warm-up, above '
              'the baseline (model and input already allocated; a training step frees its '
              'gradients after each step, so they count), each model in its own process; ratio '
              'against the same mode and size.']
    os.makedirs(args.out, exist_ok=True)
    path = osp.join(args.out, stem if args.device == 'cpu' else f'{stem}_{args.device}')
    write_json(path + '.json', dict(device=device_name(args.device), torch=torch.__version__,
                                    repeats=args.repeats, warmup=args.warmup, reference=reference,
                                    models={k: v['label'] for k, v in chosen.items()},
                                    rows=rows))
    write_markdown(path + '.md', sweep_report(rows, chosen, models[reference]['label'], header))
    sweep_plot(rows, chosen, path + '.png')
    print(open(path + '.md').read())
