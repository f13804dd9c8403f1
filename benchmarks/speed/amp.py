"""What mixed precision does to a training step: fp32 vs AMP for the demo segmentor.

AMP = what ``tools/train.py --amp`` selects: bf16 autocast on CPU (``BF16AutocastOptimWrapper``),
fp16 with dynamic loss scaling on GPU (mmengine's ``AmpOptimWrapper``). Each case runs in its own
process; time = median training step after warm-up, memory = peak above the baseline.
Results: benchmarks/results/amp.{json,md,png}.
Discussed in docs/robustness.md ('Mixed precision').

    python benchmarks/amp.py [--crop 256] [--batch 2] [--repeats 5]
"""
import argparse
import os
import os.path as osp

import torch

from nala_mm.analysis.measure import (
    add_case_argument,
    device_name,
    measure,
    print_case_result,
    run_case,
)

from paths import REPO, RESULTS
from report import markdown_table, pyplot, save_figure, write_json, write_markdown

CONFIG = osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py')
PRECISIONS = ('fp32', 'amp')
# Untimed training steps before a time is taken; a memory case runs one, so the optimizer
# state is allocated before measuring.
TIME_WARMUP = 2


def training_step_case(case: dict) -> dict:
    """One precision's training-step ``time`` or ``memory`` in this fresh process."""
    from mmengine.optim import build_optim_wrapper

    from nala_mm.amp import enable_amp
    from nala_mm.config_loading import build_model, load_config
    from nala_mm.data_samples import synthetic_batch
    crop, batch, device = case['crop'], case['batch'], case['device']
    cfg = load_config(CONFIG)
    if case['precision'] == 'amp':
        enable_amp(cfg)
    torch.manual_seed(0)
    model = build_model(cfg).to(device).train()
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    data = synthetic_batch('mmseg', batch, crop, crop, num_classes=6)

    def step():
        model.train_step(data, wrapper)

    if case['what'] == 'memory':
        return measure(step, 'memory', repeats=1, warmup=1, device=device)
    return measure(step, 'time', case['repeats'], TIME_WARMUP, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_argument(parser)
    parser.add_argument('--crop', type=int, default=256)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=RESULTS)
    args = parser.parse_args()
    if args.case is not None:
        print_case_result(training_step_case(args.case))
        return
    rows = []
    for precision in PRECISIONS:
        case = dict(precision=precision, crop=args.crop, batch=args.batch, device=args.device)
        timing = run_case(__file__, dict(case, what='time', repeats=args.repeats))
        memory = run_case(__file__, dict(case, what='memory'), memory=True)
        rows.append(dict(precision=precision, **{**timing, **memory}))
        print(rows[-1])
    fp32, amp = rows
    ratios = {}
    if 'median_ms' in fp32 and 'median_ms' in amp:
        ratios['amp speed-up (fp32 time / amp time)'] = round(
            fp32['median_ms'] / amp['median_ms'], 3)
    if 'peak_mib' in fp32 and 'peak_mib' in amp:
        ratios['amp peak memory / fp32 peak memory'] = round(amp['peak_mib'] / fp32['peak_mib'], 3)
    amp_kind = 'fp16 + loss scaling' if args.device == 'cuda' else 'bf16 autocast'
    device = device_name(args.device)
    os.makedirs(args.out, exist_ok=True)
    stem = osp.join(args.out, 'amp' if args.device == 'cpu' else f'amp_{args.device}')
    write_json(stem + '.json', dict(device=device, amp=amp_kind, crop=args.crop,
                                    batch=args.batch, rows=rows, ratios=ratios))
    lines = [f'# AMP vs fp32, one training step of the demo segmentor ({device})', '',
             f'batch {args.batch}, {args.crop}x{args.crop} crops, AMP = {amp_kind}', '']
    lines += markdown_table(['precision', 'step ms (median)', 'peak MiB above baseline'],
                            [[r['precision'], f"{r.get('median_ms', float('nan')):.1f}",
                              f"{r.get('peak_mib', float('nan')):.1f}"] for r in rows])
    lines += [''] + [f'- {k}: {v}' for k, v in ratios.items()]
    write_markdown(stem + '.md', lines)

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, title in zip(axes, ('median_ms', 'peak_mib'), ('step time (ms)', 'peak MiB')):
        ax.bar([r['precision'] for r in rows], [r.get(key, 0) for r in rows],
               color=['#4c72b0', '#dd8452'])
        ax.set_title(title)
    fig.suptitle(f'training step, {amp_kind} vs fp32')
    save_figure(fig, stem + '.png')
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
