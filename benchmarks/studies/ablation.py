"""Learning comparison of token mixers at equal budget, on the embedded demo data.

The demo's small UperNet + NaLaFormer (configs/demo/ade20k_demo_nala_upernet.py) with one mixer
in all four stages, trained from scratch on the synthetic ADE20K-layout data with the same
shortened schedule, data order and seeds; only the mixer differs, and every mixer has exactly the
same parameters (the shared gated wrapper). Each (variant, seed) trains in its own process
through tools/train.py and is evaluated once at the end (mIoU on the 40 validation images).
Results: benchmarks/results/studies/ablation.{json,md,png} (the JSON lists every run); discussed in
docs/user_guides/mixers.md.

    python -m benchmarks.studies.ablation                   # 5 variants x 3 seeds
    python -m benchmarks.studies.ablation --iters 100 --seeds 0 --variants nala-cosine softmax
"""
import argparse
import json
import os
import os.path as osp
import tempfile
from statistics import mean, stdev
from typing import Dict, List

from ..lib import report
from ..lib.paths import REPO, STUDY_RESULTS
from ..lib.presets import PRESETS, MixerPreset
from ..lib.runs import mixer_sweep_config, train_config

DEMO = osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py')
# the five of the committed sweep ('linear' is the ReLU one)
VARIANTS: Dict[str, MixerPreset] = {
    name: PRESETS[key] for name, key in (
        ('nala-cosine', 'nala-cosine'), ('nala-relu', 'nala-relu'),
        ('nala-fixed-power', 'nala-fixed-power'), ('linear', 'linear-relu'),
        ('softmax', 'softmax'))}


def run_one(variant: str, seed: int, iters: int, work_root: str) -> dict:
    run = train_config(mixer_sweep_config(DEMO, VARIANTS[variant].mixer, seed, iters),
                       f'{variant}_seed{seed}', work_root)
    if 'error' in run:
        return dict(variant=variant, seed=seed, error=run['error'])
    records = run['records']
    val = [r for r in records if 'mIoU' in r][-1]
    # mmengine logs the mean iteration time of each logging window; skip the first window
    # (start-up, data workers) when there is more than one
    times = [r['time'] for r in records if 'time' in r and 'loss' in r]
    return dict(variant=variant, seed=seed, iters=iters, mIoU=val['mIoU'], aAcc=val['aAcc'],
                sec_per_iter=mean(times[1:] or times), wall_seconds=run['wall_seconds'],
                final_loss=[r['loss'] for r in records if 'loss' in r][-1])


def summarise(runs: List[dict]) -> Dict[str, dict]:
    summary = {}
    variants = list(dict.fromkeys(r['variant'] for r in runs))
    by_seed = {(r['variant'], r['seed']): r['mIoU'] for r in runs if 'mIoU' in r}
    for variant in variants:
        ok = [r for r in runs if r['variant'] == variant and 'mIoU' in r]
        values = [r['mIoU'] for r in ok]
        # paired with the first variant at the same seed (same initial weights of everything but
        # the mixer's math, same data order): seed-to-seed variation cancels
        deltas = [by_seed[variant, r['seed']] - by_seed[variants[0], r['seed']] for r in ok
                  if (variants[0], r['seed']) in by_seed]
        summary[variant] = dict(
            label=VARIANTS[variant].label, runs=len(ok),
            mIoU_mean=mean(values) if values else None,
            mIoU_std=stdev(values) if len(values) > 1 else None,
            paired_delta_mean=mean(deltas) if deltas else None,
            paired_delta_std=stdev(deltas) if len(deltas) > 1 else None,
            paired_deltas=deltas,
            # best of the seeds, not the mean: on a shared machine a run slowed by another job
            # would otherwise set its variant's speed
            sec_per_iter_best=min(r['sec_per_iter'] for r in ok) if ok else None)
    return summary


def write_outputs(runs: List[dict], summary: Dict[str, dict], args, stem: str) -> None:
    report.write_json(stem + '.json', dict(config=osp.relpath(DEMO, REPO), iters=args.iters,
                                    seeds=args.seeds,
                                    data='embedded synthetic ADE20K-layout data (make demo)',
                                    runs=runs, summary=summary))
    first = next(iter(summary))
    lines = ['# Token mixers at equal budget (embedded demo data)', '',
             f'Demo UperNet + NaLaFormer, one mixer in all four stages, from scratch, '
             f'{args.iters} iterations of batch 8 at 128x128, seeds {args.seeds}; mIoU on the '
             f'40 validation images; time per training iteration on this CPU.', '']
    lines += report.markdown_table(
        ['mixer', 'runs', 'mIoU mean ± std',
         f'mIoU − {first} at the same seed, mean ± std (per seed)', 's / iter (best seed)'],
        [[row['label'], row['runs'], report.pm(row['mIoU_mean'], row['mIoU_std']),
          '-' if row['paired_delta_mean'] is None else
          report.pm(row['paired_delta_mean'], row['paired_delta_std'], sign=True)
          + f" ({report.signed(row['paired_deltas'])})",
          '-' if row['sec_per_iter_best'] is None else f"{row['sec_per_iter_best']:.2f}"]
         for row in summary.values()])
    lines += ['']
    lines += report.markdown_table(
        ['mixer', 'seed', 'mIoU', 'aAcc', 'final loss'],
        [[r['variant'], r['seed'], f"{r['mIoU']:.2f}", f"{r['aAcc']:.2f}",
          f"{r['final_loss']:.3f}"] if 'mIoU' in r else
         [r['variant'], r['seed'], '-', '-', f"error: {r['error']}"] for r in runs])
    report.write_markdown(stem + '.md', lines)

    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    report.seed_scatter(ax, runs, summary)
    ax.set_ylabel('mIoU')
    ax.set_title(f'mixers at equal budget ({args.iters} iterations; dots: seeds, '
                 f'squares: mean ± std)')
    ax.grid(True, axis='y', alpha=0.3)
    report.save_figure(fig, stem + '.png')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--variants', nargs='+', choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    # the schedule of the committed results (benchmarks/results/studies/ablation.json)
    parser.add_argument('--iters', type=int, default=200)
    parser.add_argument('--out', default=STUDY_RESULTS)
    report.add_report_only_argument(parser, 'ablation')
    args = parser.parse_args()
    stem = osp.join(args.out, 'ablation')
    if args.report_only:
        saved = report.read_json(stem + '.json')
        args.iters, args.seeds = saved['iters'], saved['seeds']
        write_outputs(saved['runs'], summarise(saved['runs']), args, stem)
        print(open(stem + '.md').read())
        return
    os.chdir(REPO)  # the demo config's data root is relative to the repository
    from mmengine.config import Config

    from nala_mm.datasets.synthetic_ade import generate_ade_like
    generate_ade_like(Config.fromfile(DEMO).train_dataloader.dataset.data_root)
    from tqdm import tqdm
    runs = []
    # seeds outermost: an interrupted sweep still has every variant at the first seeds
    cases = [(v, s) for s in args.seeds for v in args.variants]
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix='nala_ablation_') as work_root:
        for variant, seed in (progress := tqdm(cases, desc='ablation runs')):
            progress.set_postfix_str(f'{variant} seed {seed}')
            runs.append(run_one(variant, seed, args.iters, work_root))
            progress.write(json.dumps(runs[-1]))
            # rewritten after every run: an interrupted sweep leaves the runs it finished
            write_outputs(runs, summarise(runs), args, stem)
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
