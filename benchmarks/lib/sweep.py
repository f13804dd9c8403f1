"""Size sweeps: models against the input size, time and peak memory, each measurement in a fresh
process (nala_mm.analysis.measure), with the cost exponents, the report and the plot.

A sweep module (``benchmarks.speed.backbone``, ``.segmentor``) defines its models and a
``make_step(name, side, mode, batch, device)`` that returns one call to time, then calls
:func:`sweep_cli`; the cases run on :func:`benchmarks.lib.grid.run_grid`. Modes:

* ``fwd``: eval mode, ``torch.no_grad``, batch 1 (inference);
* ``train``: train mode, forward + backward of the loss (parameter gradients are part of the
  step's memory, optimizer state is not), batch ``--train-batch``.

``benchmarks.speed.swap`` runs its own families through :func:`size_cases` and
:func:`grid_step`.
"""
import argparse
import os
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from nala_mm.analysis.measure import Step, device_name

from .grid import Case, grid_cli, run_grid
from .grid import MakeStep as GridStep
from .report import (
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


def size_cases(models: Sequence[str], plan: Dict[str, Sequence[int]],
               batches: Dict[str, int]) -> List[Case]:
    """The grid of a size sweep: every (mode, side) of ``plan`` with all ``models``."""
    return [(dict(mode=mode, side=side, batch=batches[mode]), list(models))
            for mode, sides in plan.items() for side in sides]


def pixels(name: str, settings: dict) -> dict:
    """A sweep row's extra field (``describe`` of :func:`~benchmarks.lib.grid.run_grid`)."""
    return dict(pixels=settings['side'] ** 2)


def grid_step(make_step: MakeStep) -> GridStep:
    """A sweep's ``make_step(name, side, mode, batch, device)`` as the grid's child takes it."""
    return lambda name, case: make_step(name, case['side'], case['mode'], case['batch'],
                                        case['device'])


def backbone_step(model: torch.nn.Module, image: torch.Tensor, mode: str,
                  call: Optional[Callable] = None) -> Step:
    """One call of a backbone: eval-mode inference without gradients (``'fwd'``), or the
    forward and the backward of the sum of its outputs in train mode (``'train'``). ``call``
    runs the model instead of calling it (its compiled form); ``model`` keeps the parameters
    and the train/eval mode."""
    call = model if call is None else call
    if mode == 'fwd':
        model.eval()  # not chained: mmseg's Swin and ViT return None from train()

        def forward() -> None:
            with torch.no_grad():
                call(image)
        return forward
    model.train()

    def train_step() -> None:
        sum(out.sum() for out in call(image)).backward()
        model.zero_grad(set_to_none=True)
    return train_step


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


def sweep_cli(module: str, doc: str, stem: str, models: Dict[str, dict], make_step: MakeStep,
              reference: str, default_sizes: Dict[str, Sequence[int]], description: str) -> None:
    """Command line of a size sweep: ``--case`` (the grid's child: one measurement), the sweep
    (JSON, markdown and plot under ``--out``, ``STEM_cuda.*`` on a GPU), or ``--report-only``
    (the markdown and plot again from the JSON)."""
    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument('--sizes', nargs='*', type=int, default=list(default_sizes['fwd']),
                            help='square input sides of the inference mode (none: skip it)')
        parser.add_argument('--train-sizes', nargs='*', type=int,
                            default=list(default_sizes['train']),
                            help='square crop sides of the training-step mode (none: skip it)')
        parser.add_argument('--train-batch', type=int, default=2)
        parser.add_argument('--models', nargs='+', choices=list(models), default=list(models))
        parser.add_argument('--repeats', type=int, default=3,
                            help='timed rounds in turns (median)')
        parser.add_argument('--warmup', type=int, default=1, help='untimed runs before timing')
        parser.add_argument('--timeout', type=int, default=3600, help='seconds per measurement')

    parsed = grid_cli(doc, stem, grid_step(make_step),
                      lambda saved, path: write_sweep(path, saved, description), arguments)
    if parsed is None:
        return
    args, path = parsed
    chosen = {name: models[name] for name in args.models}
    plan = {'fwd': args.sizes, 'train': args.train_sizes}
    rows = run_grid(module, size_cases(chosen, plan, {'fwd': 1, 'train': args.train_batch}),
                    repeats=args.repeats, warmup=args.warmup, device=args.device,
                    reference=reference, timeout=args.timeout, describe=pixels, desc=stem)
    add_memory_ratios(rows, reference)
    os.makedirs(args.out, exist_ok=True)
    write_sweep(path, dict(device=device_name(args.device), torch=torch.__version__,
                           repeats=args.repeats, warmup=args.warmup, reference=reference,
                           models={k: v['label'] for k, v in chosen.items()}, rows=rows),
                description)
    print(open(path + '.md').read())


def write_sweep(path: str, saved: dict, description: str) -> None:
    """``path.json`` (``saved``), its page ``path.md`` and its plot ``path.png``."""
    models = {name: dict(label=label) for name, label in saved['models'].items()}
    # the reference's label even when --models left it out (its ratios are then empty)
    reference = saved['models'].get(saved['reference'], saved['reference'])
    header = [f"# {description} ({saved['device']})", '',
              f"torch {saved['torch']}; time: the models at one mode and size timed in turns "
              f"in one process, {saved['repeats']} rounds after {saved['warmup']} warm-up "
              f'round(s); time / {reference} = median of the per-round ratios (both calls '
              'of a round see the same load). Memory: peak of one step after the warm-up, above '
              'the baseline (model and input already allocated; a training step frees its '
              'gradients after each step, so they count), each model in its own process; ratio '
              'against the same mode and size.']
    write_json(path + '.json', saved)
    write_markdown(path + '.md', sweep_report(saved['rows'], models, reference, header))
    sweep_plot(saved['rows'], models, path + '.png')
