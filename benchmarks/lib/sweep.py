"""Size sweeps: models against the input size, time and peak memory, each measurement in a fresh
process (nala_mm.analysis.measure), with the cost exponents, the report and the plot.

A sweep script (backbone.py, segmentor.py) defines its models and a ``make_step(name, side,
mode, batch, device)`` that returns one call to time, then calls :func:`sweep_cli`. Modes:

* ``fwd``: eval mode, ``torch.no_grad``, batch 1 (inference);
* ``train``: train mode, forward + backward of the loss (parameter gradients are part of the
  step's memory, optimizer state is not), batch ``--train-batch``.

swap.py runs its own families through :func:`run_cases` and :func:`sweep_case`.
"""
import argparse
import os
import os.path as osp
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from nala_mm.analysis.measure import (
    Step,
    add_case_argument,
    device_name,
    in_turns,
    measure,
    print_case_result,
    run_case,
)

from paths import RESULTS
from report import (
    fmt,
    log_log_axes,
    markdown_table,
    pyplot,
    save_figure,
    write_json,
    write_markdown,
)

MODES = ('fwd', 'train')
MODE_TITLES = {'fwd': 'inference (no grad)', 'train': 'training step (forward + backward)'}
MakeStep = Callable[[str, int, str, int, str], Step]


def run_cases(script: str, models: Dict[str, dict], plan: Dict[str, Sequence[int]],
              batches: Dict[str, int], repeats: int, warmup: int, device: str,
              timeout: int, reference: str) -> List[dict]:
    """Every (mode, side) of ``plan``: each model's peak memory in a fresh process of its own
    (a high-water mark needs one), then all models timed in turns in one more process
    (:func:`~nala_mm.analysis.measure.in_turns`, time ratios against ``reference``), so that
    the ratios compare calls made under the same load."""
    from tqdm import tqdm
    cases = [(mode, side) for mode, sides in plan.items() for side in sides]
    rows = []
    progress = tqdm(cases, desc=osp.basename(script))
    for mode, side in progress:
        progress.set_postfix_str(f'{mode} {side}x{side}')
        case = dict(side=side, mode=mode, batch=batches[mode], repeats=repeats, warmup=warmup,
                    device=device, reference=reference)
        mine = []
        for name in models:
            memory = run_case(script, dict(case, models=[name], what='memory'), memory=True,
                              timeout=timeout)
            row = dict(model=name, mode=mode, side=side, pixels=side * side, batch=batches[mode],
                       mib=memory.get('peak_mib'))
            if 'error' in memory:
                row['error'] = memory['error']
            mine.append(row)
        # a model that ran out of memory once is not timed
        timed = [row['model'] for row in mine if 'error' not in row]
        timing = run_case(script, dict(case, models=timed, what='turns'),
                          timeout=timeout * len(timed)) if timed else {}
        for row in mine:
            result = timing.get(row['model'], {})
            row.update(ms=result.get('median_ms'), ms_best=result.get('best_ms'),
                       ms_ratio=result.get('ms_ratio'), times_ms=result.get('times_ms'))
            if 'error' in timing and 'error' not in row:
                row['error'] = timing['error']
        rows += mine
    return rows


def backbone_step(model: torch.nn.Module, image: torch.Tensor, mode: str) -> Step:
    """One call of a backbone: eval-mode inference without gradients (``'fwd'``), or the
    forward and the backward of the sum of its outputs in train mode (``'train'``)."""
    if mode == 'fwd':
        model.eval()  # not chained: mmseg's Swin and ViT return None from train()

        def forward() -> None:
            with torch.no_grad():
                model(image)
        return forward
    model.train()

    def train_step() -> None:
        sum(out.sum() for out in model(image)).backward()
        model.zero_grad(set_to_none=True)
    return train_step


def sweep_case(case: dict, make_step: MakeStep) -> dict:
    """A :func:`run_cases` child: one model's memory or time (``what``), or all of ``models``
    timed in turns (``what='turns'``)."""
    torch.manual_seed(0)
    steps = {name: make_step(name, case['side'], case['mode'], case['batch'], case['device'])
             for name in case['models']}
    if case['what'] == 'turns':
        return in_turns(steps, case['reference'], case['repeats'], case['warmup'],
                        case['device'])
    step, = steps.values()
    return measure(step, case['what'], case['repeats'], case['warmup'], case['device'])


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
    and size (< 1 = lighter). Time ratios come from the rounds in turns."""
    for row in rows:
        ref = next((r for r in rows if r['model'] == reference and r['mode'] == row['mode']
                    and r['side'] == row['side']), {})
        value, base = row.get('mib'), ref.get('mib')
        row['mib_ratio'] = None if value is None or not base else value / base


def sweep_report(rows: List[dict], models: Dict[str, dict], reference_label: str,
                 header: List[str]) -> List[str]:
    """The markdown page: one table per mode, then the cost exponents."""
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
    """Time and peak memory against the pixel count, log-log, a row of two plots per mode."""
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
    save_figure(fig, path)


def sweep_cli(script: str, doc: str, stem: str, models: Dict[str, dict], make_step: MakeStep,
              reference: str, default_sizes: Dict[str, Sequence[int]], description: str) -> None:
    """Command line of a size sweep: ``--case`` (child: one measurement, :func:`sweep_case`)
    or the sweep (parent: JSON, markdown and plot under ``--out``, ``STEM_cuda.*`` on a GPU)."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_argument(parser)
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
    if args.case is not None:
        print_case_result(sweep_case(args.case, make_step))
        return

    chosen = {name: models[name] for name in args.models}
    plan = {'fwd': args.sizes, 'train': args.train_sizes}
    rows = run_cases(script, chosen, plan, {'fwd': 1, 'train': args.train_batch},
                     args.repeats, args.warmup, args.device, args.timeout, reference)
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
