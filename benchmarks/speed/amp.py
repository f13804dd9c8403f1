"""What mixed precision does to a training step: fp32 vs AMP for the demo segmentor.

AMP = what ``tools/train.py --amp`` selects: bf16 autocast on CPU (``BF16AutocastOptimWrapper``),
fp16 with dynamic loss scaling on GPU (mmengine's ``AmpOptimWrapper``). On
:func:`benchmarks.lib.grid.run_grid`: each precision's peak memory in its own process, then both
timed in turns in one process. Results: benchmarks/results/speed/amp.{json,md,png}.
Discussed in docs/user_guides/robustness.md ('Mixed precision').

    python -m benchmarks.speed.amp [--crop 256] [--batch 2] [--repeats 5]
"""
import argparse
import os
import os.path as osp

import torch

from nala_mm.analysis.measure import device_name

from ..lib import report
from ..lib.grid import grid_cli, run_grid
from ..lib.paths import REPO
from ..lib.provenance import code_version

CONFIG = osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py')
PRECISIONS = ('fp32', 'amp')
# Untimed training steps before the timed rounds; a memory case runs one, so the optimizer
# state is allocated before measuring.
TIME_WARMUP = 2


def step_of(precision: str, case: dict):
    """The grid's child: one training step of the demo segmentor at ``precision``."""
    from mmengine.optim import build_optim_wrapper

    from nala_mm.apis.config_loading import build_model, load_config
    from nala_mm.apis.data_samples import synthetic_batch
    from nala_mm.engine.optimizers import enable_amp
    crop, batch, device = case['crop'], case['batch'], case['device']
    cfg = load_config(CONFIG)
    if precision == 'amp':
        enable_amp(cfg)
    model = build_model(cfg).to(device).train()
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    data = synthetic_batch('mmseg', batch, crop, crop, num_classes=6)

    def step():
        model.train_step(data, wrapper)
    return step


def cpu_bf16() -> dict:
    """The CPU's model and whether it has native bf16 instructions (AVX512-BF16 or AMX): without
    them bf16 matmuls and convs are emulated, and autocast slows a step down."""
    info = dict(line.split(':', 1) for line in open('/proc/cpuinfo') if ':' in line)
    flags = set(info.get('flags\t', info.get('flags', '')).split())
    return dict(cpu_model=info.get('model name\t', info.get('model name', '?')).strip(),
                native_bf16=bool(flags & {'avx512_bf16', 'amx_bf16'}))


def write_outputs(saved: dict, stem: str) -> None:
    """``stem.json`` (``saved``), the page ``stem.md`` and the plot ``stem.png``."""
    report.write_json(stem + '.json', saved)
    rows = saved['rows']
    lines = [f"# AMP vs fp32, one training step of the demo segmentor ({saved['device']})", '',
             f"batch {saved['batch']}, {saved['crop']}x{saved['crop']} crops, AMP = "
             f"{saved['amp']}" + (f" ({saved['cpu_model']}, "
                                  f"{'with' if saved['native_bf16'] else 'without'} native bf16)"
                                  if 'cpu_model' in saved else '') +
             ". Time: both precisions timed in turns in one process, "
             f"{saved['repeats']} rounds after {saved['warmup']} warm-up steps; memory: peak "
             'above the baseline, each in its own process (after one step, so the optimizer '
             'state is allocated).', '']
    lines += report.markdown_table(['precision', 'step ms (median)', 'time / fp32',
                             'peak MiB above baseline', 'memory / fp32'],
                            [[r['model'], report.fmt(r.get('ms')),
                              report.fmt(r.get('ms_ratio'), 3), report.fmt(r.get('mib')),
                              report.fmt(r.get('mib_ratio'), 3)] for r in rows])
    report.write_markdown(stem + '.md', lines)
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, title in zip(axes, ('ms', 'mib'), ('step time (ms)', 'peak MiB')):
        ax.bar([r['model'] for r in rows], [r.get(key) or 0 for r in rows],
               color=['#4c72b0', '#dd8452'])
        ax.set_title(title)
    fig.suptitle(f"training step, {saved['amp']} vs fp32")
    report.save_figure(fig, stem + '.png')


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--crop', type=int, default=256)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)


def main() -> None:
    parsed = grid_cli(__doc__, 'amp', step_of, write_outputs, arguments)
    if parsed is None:
        return
    args, stem = parsed
    rows = run_grid(__spec__.name, [(dict(crop=args.crop, batch=args.batch), PRECISIONS)],
                    repeats=args.repeats, warmup=TIME_WARMUP, device=args.device,
                    reference='fp32', desc='precision')
    fp32 = rows[0]
    for row in rows:
        row['mib_ratio'] = row['mib'] / fp32['mib'] if row.get('mib') and fp32.get('mib') \
            else None
    os.makedirs(args.out, exist_ok=True)
    write_outputs(dict(commit=code_version(), device=device_name(args.device),
                       torch=torch.__version__,
                       amp='fp16 + loss scaling' if args.device == 'cuda' else 'bf16 autocast',
                       crop=args.crop, batch=args.batch, repeats=args.repeats,
                       warmup=TIME_WARMUP, rows=rows,
                       **(cpu_bf16() if args.device == 'cpu' else {})), stem)
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
