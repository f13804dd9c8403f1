"""What mixed precision does to a training step: fp32 vs AMP for the demo segmentor.

AMP = what ``tools/train.py --amp`` selects: bf16 autocast on CPU (``BF16AutocastOptimWrapper``),
fp16 with dynamic loss scaling on GPU (mmengine's ``AmpOptimWrapper``). Each case runs in its own
process; time = median training step after warm-up, memory = peak above the baseline.
Results: benchmarks/results/amp.{json,md,png}.
Discussed in docs/robustness.md ('Mixed precision').

    python benchmarks/amp.py [--crop 256] [--batch 2] [--repeats 5]
"""
import argparse
import json
import os
import os.path as osp

import torch

from common import (RESULTS, device_name, markdown_table, median_ms, peak_memory_mib,
                    pyplot, spawn, write_json, write_markdown)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py')
PRECISIONS = ('fp32', 'amp')


def run_case(precision: str, crop: int, batch: int, measure: str, repeats: int,
             device: str) -> dict:
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData

    from nala_mm.runtime import enable_amp, load_config
    cfg = load_config(CONFIG)
    if precision == 'amp':
        enable_amp(cfg)
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).to(device).train()
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    images = [torch.randint(0, 256, (3, crop, crop), dtype=torch.uint8) for _ in range(batch)]
    samples = []
    for _ in range(batch):
        sample = SegDataSample(metainfo=dict(img_shape=(crop, crop), ori_shape=(crop, crop),
                                             pad_shape=(crop, crop)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 6, (1, crop, crop)))
        samples.append(sample)
    data = dict(inputs=images, data_samples=samples)

    def step():
        model.train_step(data, wrapper)

    if measure == 'memory':
        step()  # optimizer state allocated before measuring
        return dict(peak_mib=peak_memory_mib(step, device))
    return dict(median_ms=median_ms(step, repeats, device, warmup=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--case', nargs=6, help=argparse.SUPPRESS)
    parser.add_argument('--crop', type=int, default=256)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=RESULTS)
    args = parser.parse_args()
    if args.case:
        precision, crop, batch, measure, repeats, device = args.case
        print(json.dumps(run_case(precision, int(crop), int(batch), measure, int(repeats),
                                  device)))
        return
    rows = []
    for precision in PRECISIONS:
        case = [precision, str(args.crop), str(args.batch)]
        timing = spawn(__file__, case + ['time', str(args.repeats), args.device], memory=False)
        memory = spawn(__file__, case + ['memory', '1', args.device], memory=True)
        rows.append(dict(precision=precision, **timing, **memory))
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
    fig.tight_layout()
    fig.savefig(stem + '.png', dpi=120)
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
