"""What a user switching a trained Swin to NaLa can expect: a small Swin + UperNet trained with
its stock shifted-window softmax attention, then (a) stages 1-2 swapped to NaLa, the softmax
weights carried over (nala_mm.models.swap), and fine-tuned, against (b) the same model continuing
with softmax for the same iterations. Same seeds, data order and schedule in both arms.

On the embedded demo data (make demo), where the ablation found the mixers do not separate, this
measures how much of the trained model survives the swap and how fast it recovers, not a
difference between the mixers. Every run trains in its own process through tools/train.py; the
swap is tools/linearize.py with ``--iters 0`` (the weights carried over, no transfer), and the
swapped model right after it (no fine-tuning) is evaluated through tools/test.py.
Results: benchmarks/results/studies/swap_finetune.{json,md,png}; discussed in
docs/user_guides/swap.md.

    python -m benchmarks.studies.swap_finetune                  # 3 seeds
    python -m benchmarks.studies.swap_finetune --seeds 0 --pretrain-iters 40 --finetune-iters 20
    python -m benchmarks.studies.swap_finetune --report-only    # table and plot from the JSON
"""
import argparse
import json
import os
import os.path as osp
import tempfile
from statistics import mean, stdev
from typing import Dict, List

from nala_mm.models import DEFAULT_HYBRID

from ..lib import report
from ..lib.evaluation import final_miou, linearize, test_miou
from ..lib.paths import REPO, STUDY_RESULTS
from ..lib.runs import DEMO, SMALL_SWIN, small_swin_config, train_config

ARMS = {
    'softmax': dict(label='Swin, softmax continued', mixers=('softmax',) * 4),
    'nala': dict(label='Swin, stages 1-2 swapped to NaLa and fine-tuned',
                 mixers=DEFAULT_HYBRID),
}


def config_text(arm: str, seed: int, iters: int, load_from) -> str:
    return small_swin_config(ARMS[arm]['mixers'], seed, iters, load_from)


def one_seed(seed: int, pretrain_iters: int, finetune_iters: int, root: str) -> dict:
    pretrain = train_config(config_text('softmax', seed, pretrain_iters, None),
                            f'pretrain_seed{seed}', root)
    result = dict(seed=seed, pretrained_mIoU=final_miou(pretrain),
                  pretrain_seconds=pretrain['wall_seconds'])
    softmax_ckpt = osp.join(root, f'pretrain_seed{seed}', f'iter_{pretrain_iters}.pth')
    nala_config = osp.join(root, f'swapped_seed{seed}.py')
    with open(nala_config, 'w') as f:
        f.write(config_text('nala', seed, finetune_iters, None))
    converted = osp.join(root, f'swapped_seed{seed}.pth')
    linearize(nala_config, softmax_ckpt, converted, iters=0, seed=seed)  # the plain swap
    result['swapped_before_finetune_mIoU'] = test_miou(nala_config, converted,
                                                       osp.join(root, f'test_seed{seed}'))
    for arm, start in (('softmax', softmax_ckpt), ('nala', converted)):
        run = train_config(config_text(arm, seed, finetune_iters, start),
                           f'{arm}_finetune_seed{seed}', root)
        result[f'{arm}_mIoU'] = final_miou(run)
        result[f'{arm}_seconds'] = run['wall_seconds']
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=STUDY_RESULTS)
    report.add_report_only_argument(parser, 'swap_finetune')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--pretrain-iters', type=int, default=1000)
    parser.add_argument('--finetune-iters', type=int, default=300)
    args = parser.parse_args()
    stem = osp.join(args.out, 'swap_finetune')
    if args.report_only:
        write_outputs(report.read_json(stem + '.json'), stem)
        return
    from mmengine.config import Config
    from tqdm import tqdm

    from nala_mm.datasets.synthetic_ade import generate_ade_like
    # the demo's data, generated once (deterministic; a rerun reuses it)
    generate_ade_like(osp.join(REPO, Config.fromfile(DEMO).train_dataloader.dataset.data_root))
    runs: List[Dict] = []
    with tempfile.TemporaryDirectory() as root:
        for seed in tqdm(args.seeds, desc='seeds'):
            runs.append(one_seed(seed, args.pretrain_iters, args.finetune_iters, root))
            print(json.dumps(runs[-1]), flush=True)
    deltas = [r['nala_mIoU'] - r['softmax_mIoU'] for r in runs]

    def stat(key):
        values = [r[key] for r in runs]
        return dict(mean=mean(values), std=stdev(values) if len(values) > 1 else None)

    summary = {key: stat(key) for key in ('pretrained_mIoU', 'swapped_before_finetune_mIoU',
                                          'softmax_mIoU', 'nala_mIoU')}
    summary['nala_minus_softmax'] = dict(mean=mean(deltas),
                                         std=stdev(deltas) if len(deltas) > 1 else None,
                                         per_seed=deltas)
    payload = dict(data='embedded synthetic ADE20K-layout data (make demo)', backbone=SMALL_SWIN,
                   pretrain_iters=args.pretrain_iters, finetune_iters=args.finetune_iters,
                   seeds=args.seeds, arms={k: v['label'] for k, v in ARMS.items()},
                   runs=runs, summary=summary)
    os.makedirs(args.out, exist_ok=True)
    write_outputs(payload, stem)


def write_outputs(payload: dict, stem: str) -> None:
    """``stem.json``, the tables in ``stem.md`` and the plot ``stem.png`` (``--report-only``
    rewrites the last two from the first)."""
    report.write_json(stem + '.json', payload)
    runs, summary = payload['runs'], payload['summary']
    pretrain, finetune = payload['pretrain_iters'], payload['finetune_iters']

    def cell(key):
        return report.pm(summary[key]['mean'], summary[key]['std'])

    lines = ['# Swapping a trained Swin to NaLa: recovery after the swap (embedded demo data)', '',
             f'Swin (embed 32, depths 2-2-2-2, window 7) + UperNet, trained {pretrain} '
             f'iterations of batch 4 with softmax, then {finetune} more in each arm (same '
             f"schedule and seed); mIoU on the 40 validation images, seeds {payload['seeds']}.",
             '']
    lines += report.markdown_table(['stage', 'mIoU mean ± std'], [
        [f'softmax, after {pretrain} iterations', cell('pretrained_mIoU')],
        ['stages 1-2 swapped to NaLa, weights carried, no fine-tuning',
         cell('swapped_before_finetune_mIoU')],
        [f'softmax continued {finetune} iterations', cell('softmax_mIoU')],
        [f'NaLa (stages 1-2) fine-tuned {finetune} iterations', cell('nala_mIoU')],
        ['NaLa − softmax at the same seed',
         f"{cell('nala_minus_softmax')} "
         f"({report.signed(summary['nala_minus_softmax']['per_seed'])})"]])
    lines += ['']
    lines += report.markdown_table(
        ['seed', 'softmax pretrained', 'swapped, no fine-tuning', 'softmax continued',
         'NaLa fine-tuned'],
        [[r['seed'], f"{r['pretrained_mIoU']:.2f}", f"{r['swapped_before_finetune_mIoU']:.2f}",
          f"{r['softmax_mIoU']:.2f}", f"{r['nala_mIoU']:.2f}"] for r in runs])
    report.write_markdown(stem + '.md', lines)

    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in runs:
        ax.plot([0, 1], [r['pretrained_mIoU'], r['softmax_mIoU']], color='tab:blue', marker='o',
                label='softmax continued' if r is runs[0] else None)
        ax.plot([0, 0.5, 1], [r['pretrained_mIoU'], r['swapped_before_finetune_mIoU'],
                              r['nala_mIoU']], color='tab:orange', marker='o',
                label='swapped to NaLa, fine-tuned' if r is runs[0] else None)
    ax.set_xticks([0, 0.5, 1], ['softmax trained', 'right after swap', 'after fine-tuning'])
    ax.set_ylabel('mIoU')
    ax.set_title('Swin stages 1-2 swapped to NaLa (demo data)')
    ax.legend()
    report.save_figure(fig, stem + '.png')
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
