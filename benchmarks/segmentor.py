"""Segmentor benchmark: UperNet + NaLaFormer-T (hybrid, all-linear) vs UperNet + Swin-T, inference.

Batch 1, eval mode, ``torch.no_grad``, ``forward(mode='tensor')`` (backbone + decode head, i.e.
the network without resizing the logits back to the image). Each (model, side, measurement)
runs in its own process:
  * time: median of ``--repeats`` runs after ``--warmup`` runs (CUDA events on GPU);
  * memory: peak of one run after the warm-up, above the process's baseline (model, input and
    one-time caches already allocated): on CPU resident memory (VmHWM, reset through
    /proc/self/clear_refs, with glibc told to return large blocks at once so freed memory is not
    counted twice), on GPU ``torch.cuda.max_memory_allocated`` (benchmarks/common.py).
A case that fails (out of memory, timeout) is recorded with its error. The cost exponent of each
model is the slope of a log-log least-squares fit of time (and memory) against pixels.
Results: benchmarks/results/segmentor.{json,md,png} (``segmentor_cuda.*`` on GPU).

    python benchmarks/segmentor.py                              # 512, 1024, 2048
    python benchmarks/segmentor.py --sizes 512 1024 --repeats 3
    python benchmarks/segmentor.py --device cuda

The sweep, fits and reports below are shared with benchmarks/backbone.py.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import median_ms, peak_memory_mib, spawn  # noqa: E402

RESULTS = osp.join(osp.dirname(osp.abspath(__file__)), 'results')
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
REFERENCE_MODEL, REFERENCE_LABEL = 'swin_t', 'Swin-T'  # ratios are against this model
SEGMENTORS: Dict[str, dict] = {
    'nala_t_hybrid': dict(label='UperNet + NaLaFormer-T (hybrid)',
                          config=osp.join(REPO, 'configs', 'ade20k_nala_upernet.py'),
                          cfg_options={}),
    'nala_t_linear': dict(label='UperNet + NaLaFormer-T (all linear)',
                          config=osp.join(REPO, 'configs', 'ade20k_nala-t-linear_upernet.py'),
                          cfg_options={}),
    # no downloads here: the stock config's ImageNet init_cfg is dropped (weights do not matter)
    'swin_t': dict(label='UperNet + Swin-T',
                   config='mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_'
                          'ade20k-512x512.py',
                   cfg_options={'model.backbone.init_cfg': None}),
}

Step = Callable[[], None]


# ---------------------------------------------------------------------------- measuring (child)
def measure(step: Step, what: str, repeats: int, warmup: int, device: str) -> dict:
    """Peak memory of one ``step`` or its median time, after ``warmup`` steps (so one-time
    allocations such as kernel caches are part of the baseline)."""
    if what == 'memory':
        for _ in range(warmup):
            step()
        return dict(peak_mib=peak_memory_mib(step, device))
    return dict(median_ms=median_ms(step, repeats, device, warmup=warmup), repeats=repeats)


def segmentor_step(name: str, side: int, mode: str, device: str) -> Step:
    """One batch-1 inference (``mode`` is always ``'fwd'`` here) of a segmentor built from its
    config; the logits stay at 1/4 scale."""
    from nala_mm.analysis import build_model_from_config
    spec = SEGMENTORS[name]
    model, _ = build_model_from_config(spec['config'], dict(spec['cfg_options']))
    model = model.to(device)
    image = torch.randn(1, 3, side, side, device=device)

    def step() -> None:
        with torch.no_grad():
            model(image, mode='tensor')

    return step


# ---------------------------------------------------------------------------- driving (parent)
def spawn_case(script: str, case: Sequence, what: str, timeout: int) -> dict:
    """One measurement in a fresh process; an ``error`` entry if it fails or times out."""
    try:
        return spawn(script, [*map(str, case), what], memory=(what == 'memory'), timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f'timeout after {timeout} s')


def run_cases(script: str, models: Dict[str, dict], sizes: Sequence[int], modes: Sequence[str],
              repeats: int, warmup: int, device: str, timeout: int) -> List[dict]:
    from tqdm import tqdm
    rows = []
    cases = [(name, side) for side in sizes for name in models]
    progress = tqdm(cases, desc=osp.basename(script))
    for name, side in progress:
        progress.set_postfix_str(f'{name} {side}x{side}')
        row = dict(model=name, side=side, pixels=side * side)
        for mode in modes:
            case = (name, side, mode, repeats, warmup, device)
            memory = spawn_case(script, case, 'memory', timeout)
            # a case that runs out of memory once is not timed
            timing = spawn_case(script, case, 'time', timeout) if 'error' not in memory else {}
            row[f'{mode}_mib'] = memory.get('peak_mib')
            row[f'{mode}_ms'] = timing.get('median_ms')
            errors = [r['error'] for r in (memory, timing) if 'error' in r]
            if errors:
                row[f'{mode}_error'] = errors[0]
        rows.append(row)
    return rows


def fit_exponent(rows: List[dict], model: str, key: str) -> Optional[float]:
    """Slope of log(value) vs log(pixels): ~1 linear, ~2 quadratic in the pixel count."""
    points = [(r['pixels'], r[key]) for r in rows
              if r['model'] == model and (r.get(key) or 0) > 0]
    if len(points) < 2:
        return None
    pixels, values = np.log(np.array(points, dtype=float)).T
    return float(np.polyfit(pixels, values, 1)[0])


def _reference_value(rows: List[dict], side: int, key: str) -> Optional[float]:
    return next((r.get(key) for r in rows if r['model'] == REFERENCE_MODEL and r['side'] == side),
                None)


def write_markdown(rows: List[dict], fits: Dict[str, dict], models: Dict[str, dict],
                   modes: Sequence[str], header: List[str], path: str) -> None:
    columns = ['model', 'side']
    for mode in modes:
        columns += [f'{mode} ms', f'x {REFERENCE_LABEL}', f'{mode} peak MiB',
                    f'x {REFERENCE_LABEL}']
    lines = header + ['', '| ' + ' | '.join(columns) + ' | error |',
                      '|' + '---|' * (len(columns) + 1)]
    for row in rows:
        cells = [models[row['model']]['label'], str(row['side'])]
        for mode in modes:
            for key in (f'{mode}_ms', f'{mode}_mib'):
                value, ref = row.get(key), _reference_value(rows, row['side'], key)
                cells.append('-' if value is None else f'{value:.1f}')
                cells.append('-' if value is None or not ref else f'{value / ref:.2f}')
        errors = '; '.join(f'{m}: {row[f"{m}_error"]}' for m in modes if f'{m}_error' in row)
        lines.append('| ' + ' | '.join(cells) + f' | {errors} |')
    lines += ['', '## Cost exponents (log-log least-squares slope vs pixels; 1 = linear, '
                  '2 = quadratic)', '',
              '| model | ' + ' | '.join(f'{m} time | {m} memory' for m in modes) + ' |',
              '|' + '---|' * (1 + 2 * len(modes))]
    for name, fit in fits.items():
        cells = ['-' if fit[k] is None else f'{fit[k]:.2f}'
                 for m in modes for k in (f'{m}_ms', f'{m}_mib')]
        lines.append(f"| {models[name]['label']} | " + ' | '.join(cells) + ' |')
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def plot(rows: List[dict], models: Dict[str, dict], modes: Sequence[str], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(modes), 2, figsize=(11, 4.2 * len(modes)), squeeze=False)
    for mode, (ax_time, ax_mem) in zip(modes, axes):
        for name, spec in models.items():
            mine = [r for r in rows if r['model'] == name]
            for ax, key in ((ax_time, f'{mode}_ms'), (ax_mem, f'{mode}_mib')):
                points = [(r['pixels'], r[key]) for r in mine if (r.get(key) or 0) > 0]
                if points:
                    ax.plot(*zip(*points), marker='o', label=spec['label'])
        for ax, title in ((ax_time, f'{mode} time (ms)'), (ax_mem, f'{mode} peak memory (MiB)')):
            ax.set_xscale('log')
            ax.set_yscale('log')
            ax.set_xlabel('pixels')
            ax.set_title(title)
            ax.grid(True, which='both', alpha=0.3)
        ax_time.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cli(script: str, doc: str, stem: str, models: Dict[str, dict],
        make_step: Callable[[str, int, str, str], Step], default_sizes: Sequence[int],
        description: str, backward_flag: bool = False) -> None:
    """Command line shared by the benchmarks: ``--case`` (child) or the whole sweep (parent)."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--case', nargs=7, help=argparse.SUPPRESS)
    parser.add_argument('--sizes', nargs='+', type=int, default=list(default_sizes),
                        help='square input sides in pixels')
    parser.add_argument('--models', nargs='+', choices=list(models), default=list(models))
    parser.add_argument('--repeats', type=int, default=5, help='timed runs (median)')
    parser.add_argument('--warmup', type=int, default=1, help='untimed runs before timing')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--timeout', type=int, default=7200, help='seconds per measurement')
    parser.add_argument('--out', default=RESULTS, help='output folder')
    if backward_flag:
        parser.add_argument('--backward', action='store_true',
                            help='also measure forward + backward')
    args = parser.parse_args()
    if args.case:
        name, side, mode, repeats, warmup, device, what = args.case
        torch.manual_seed(0)
        step = make_step(name, int(side), mode, device)
        print(json.dumps(measure(step, what, int(repeats), int(warmup), device)))
        return

    modes = ['fwd', 'fwd_bwd'] if getattr(args, 'backward', False) else ['fwd']
    chosen = {name: models[name] for name in args.models}
    rows = run_cases(script, chosen, args.sizes, modes, args.repeats, args.warmup, args.device,
                     args.timeout)
    fits = {name: {f'{m}_{unit}': fit_exponent(rows, name, f'{m}_{unit}')
                   for m in modes for unit in ('ms', 'mib')} for name in chosen}
    device_name = torch.cuda.get_device_name() if args.device == 'cuda' else \
        f'CPU, {torch.get_num_threads()} threads'
    header = [f'# {description} ({device_name})', '',
              f'torch {torch.__version__}; batch 1; time = median of {args.repeats} after '
              f'{args.warmup} warm-up; memory = peak of one run after the warm-up, above the '
              'baseline (model and input already allocated); ratios are against the reference '
              'model at the same size.']
    os.makedirs(args.out, exist_ok=True)
    path = osp.join(args.out, stem if args.device == 'cpu' else f'{stem}_{args.device}')
    with open(path + '.json', 'w') as f:
        json.dump(dict(device=device_name, torch=torch.__version__, repeats=args.repeats,
                       warmup=args.warmup, models={k: v['label'] for k, v in chosen.items()},
                       rows=rows, exponents=fits), f, indent=2)
    write_markdown(rows, fits, chosen, modes, header, path + '.md')
    plot(rows, chosen, modes, path + '.png')
    print(open(path + '.md').read())


if __name__ == '__main__':
    cli(osp.abspath(__file__), __doc__, 'segmentor', SEGMENTORS, segmentor_step,
        default_sizes=(512, 1024, 2048), description='Segmentor inference benchmark')
