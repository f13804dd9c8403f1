"""What attention transfer buys: a softmax-trained model converted to NaLa by a plain swap or by
``tools/linearize.py`` (transfer, no labels) and then fine-tuned, against the softmax model
continued, at equal labelled budget.

Teachers, each trained once with softmax attention (seed 0) and frozen as the starting point:

* ``swin``: the small Swin + UperNet of the swap study on the demo data (benchmarks/lib/runs.py),
  NaLa in stages 1-2;
* ``vit``: a one-layer ViT (patch 8, the class token) on the long-range exemplar task
  (projects/longrange/configs/ade20k_longrange_vit.py), NaLa in its layer. Calibrated as the task
  was: softmax must beat the no-mixing control (the same ViT with IdentityAttention, trained
  alike) by at least 15 mIoU before any arm runs; the control's convolutions are measured to
  reach less far than the exemplar.

Arms, per seed (the seed sets the data order of the transfer and the fine-tuning):

* ``plain``: swapped (weights carried over), fine-tuned N labelled iterations;
* ``transfer``: swapped, M iterations of attention transfer (unlabelled), fine-tuned N;
* ``softmax``: the teacher continued N iterations.

The swapped checkpoints come from tools/linearize.py (``--iters 0`` is the plain swap) and are
evaluated before fine-tuning (zero-shot); fine-tuning evaluates every N/4 iterations (the curve).
Every run is its own process (tools/train.py, tools/test.py, tools/linearize.py).

The teachers, the arms' configs and the runs are shared by the two follow-up studies beside
this one: :mod:`.linearize_choices` (the transfer's design choices on the Swin teacher) and
:mod:`.linearize_iterations` (the ViT teacher's zero-shot mIoU against transfer iterations).
Results: benchmarks/results/studies/linearize.{json,md,png}; discussed in
docs/user_guides/linearize.md.

    python -m benchmarks.studies.linearize           # both teachers, 3 seeds
    python -m benchmarks.studies.linearize --teachers swin --seeds 0 --finetune-iters 40 \
        --out /tmp/l
    python -m benchmarks.studies.linearize --report-only
"""
import argparse
import json
import os
import os.path as osp
import time
from statistics import mean, stdev
from typing import Dict, List, Optional

from nala_mm.models import DEFAULT_HYBRID

from ..lib import report
from ..lib.evaluation import curve, linearize, test_miou
from ..lib.paths import REPO, STUDY_RESULTS
from ..lib.provenance import code_version
from ..lib.runs import DEMO, schedule, small_swin_config, train_config

# the long-range task's ViTs, from the project (a benchmark may import a project's modules)
VIT_STOCK = osp.join(REPO, 'projects', 'longrange', 'configs', 'ade20k_longrange_vit.py')
VIT_NALA = osp.join(REPO, 'projects', 'longrange', 'configs', 'ade20k_longrange_vit_nala.py')
REQUIRED_GAP = 15.0  # mIoU by which softmax must beat the control (as the long-range task)
# finetune_lr: a tenth of the rate each teacher was trained at, as a trained model is fine-tuned
# (at the training rate, every arm first loses what it started with, and the starts no longer
# matter)
TEACHERS: Dict[str, dict] = {
    'swin': dict(label='small Swin + UperNet, demo data, NaLa in stages 1-2',
                 pretrain_iters=1000, transfer_iters=200, finetune_iters=300, finetune_lr=2e-4),
    'vit': dict(label='one-layer ViT, long-range exemplar task, NaLa in its layer',
                pretrain_iters=1500, transfer_iters=200, finetune_iters=300, finetune_lr=1e-4),
}
ARMS = {'plain': 'plain swap, fine-tuned', 'transfer': 'swap + attention transfer, fine-tuned',
        'softmax': 'softmax continued'}


def config_text(teacher: str, arm: str, seed: int, iters: int, load_from=None,
                val_every=None, mixer: Optional[dict] = None, lr: Optional[float] = None) -> str:
    """A run's config: the teacher's model (``arm='softmax'``) or its swap; ``lr`` replaces the
    recipe's learning rate (fine-tuning)."""
    rate = '' if lr is None else f'optim_wrapper = dict(optimizer=dict(lr={lr!r}))\n'
    if teacher == 'swin':
        mixers = ('softmax',) * 4 if arm == 'softmax' else DEFAULT_HYBRID
        return small_swin_config(mixers, seed, iters,
                                 load_from, val_every) + rate
    base = VIT_STOCK if arm == 'softmax' else VIT_NALA
    text = f'_base_ = [{base!r}]\n'
    if mixer is not None:
        text += f'model = dict(backbone=dict(mixers=({mixer!r},)))\n'
    return text + schedule(seed, iters, load_from, val_every) + rate


def finished(result: dict, what: str) -> dict:
    if 'error' in result:
        raise RuntimeError(f'{what}: {result["error"]}')
    return result


def prepare_data(teacher: str) -> None:
    from mmengine.config import Config
    if teacher == 'swin':
        from nala_mm.datasets.synthetic_ade import generate_ade_like
        generate_ade_like(osp.join(REPO, Config.fromfile(DEMO).train_dataloader.dataset.data_root))
    else:
        from projects.longrange.data import generate_longrange
        cfg = Config.fromfile(VIT_STOCK)
        generate_longrange(osp.join(REPO, cfg.train_dataloader.dataset.data_root),
                           image_size=cfg.image_size)


def train_teacher(teacher: str, spec: dict, root: str) -> dict:
    """The softmax teacher (and, for the ViT, the calibration against the control)."""
    iters = spec['pretrain_iters']
    result = {}
    if teacher == 'vit':
        from nala_mm.apis.config_loading import build_model_from_config
        from projects.longrange.data import FAR_PX

        from ..lib.receptive_field import conv_reach
        control, _ = build_model_from_config(VIT_NALA, {
            'model.backbone.mixers': [dict(type='IdentityAttention')]})
        control.init_weights()
        result['control_conv_reach_px'] = conv_reach(control, (128, 128))
        if result['control_conv_reach_px'] >= FAR_PX:
            raise RuntimeError(f'the control ViT reaches {result["control_conv_reach_px"]} px, '
                               f'as far as the exemplar ({FAR_PX} px)')
        run_control = finished(train_config(config_text(
            'vit', 'control', 0, iters, mixer=dict(type='IdentityAttention')), 'control', root),
            'training the control')
        result['control_mIoU'] = curve(run_control['records'])[-1]
    pretrain = finished(train_config(config_text(teacher, 'softmax', 0, iters), 'teacher', root),
                        'training the teacher')
    result.update(teacher_mIoU=curve(pretrain['records'])[-1],
                  teacher_seconds=pretrain['wall_seconds'],
                  checkpoint=osp.join(root, 'teacher', f'iter_{iters}.pth'))
    if teacher == 'vit':
        result['gap'] = result['teacher_mIoU'] - result['control_mIoU']
        result['calibrated'] = result['gap'] >= REQUIRED_GAP
    return result


def one_seed(teacher: str, spec: dict, seed: int, start: dict, root: str) -> dict:
    swapped_cfg = osp.join(root, f'swapped_seed{seed}.py')
    with open(swapped_cfg, 'w') as f:
        f.write(config_text(teacher, 'plain', seed, spec['finetune_iters']))
    out = dict(seed=seed)
    for arm, iters in (('plain', 0), ('transfer', spec['transfer_iters'])):
        path = osp.join(root, f'{arm}_seed{seed}.pth')
        report = linearize(swapped_cfg, start['checkpoint'], path, iters, seed)
        out[f'{arm}_report'] = {k: report[k] for k in ('rows', 'seconds', 'wall_seconds',
                                                      'options')}
        out[f'{arm}_zero_shot_mIoU'] = test_miou(swapped_cfg, path,
                                                 osp.join(root, f'test_{arm}_{seed}'))
        out[f'{arm}_checkpoint'] = path
    n, every = spec['finetune_iters'], spec['finetune_iters'] // 4
    for arm in ARMS:
        load = start['checkpoint'] if arm == 'softmax' else out[f'{arm}_checkpoint']
        result = finished(train_config(
            config_text(teacher, arm, seed, n, load, val_every=every, lr=spec['finetune_lr']),
            f'{arm}_finetune_seed{seed}', root), f'fine-tuning {arm}')
        out[f'{arm}_curve'] = curve(result['records'])
        out[f'{arm}_seconds'] = result['wall_seconds']
    for arm in ('plain', 'transfer'):
        del out[f'{arm}_checkpoint']
    return out


def iterations_to_reach(points: List[int], values: List[float], target: float) -> Optional[int]:
    """The first labelled iteration count at which ``values`` reach ``target``."""
    return next((p for p, v in zip(points, values) if v >= target), None)


def summarise(saved: dict) -> dict:
    for teacher, entry in saved['teachers'].items():
        runs = entry.get('runs', [])
        if not runs:
            continue
        spec = entry['spec']
        every = spec['finetune_iters'] // 4
        points = [0] + [every * (i + 1) for i in range(4)]
        summary = {}
        for arm in ARMS:
            curves = [([r[f'{arm}_zero_shot_mIoU']] if arm != 'softmax' else
                       [entry['start']['teacher_mIoU']]) + r[f'{arm}_curve'] for r in runs]
            summary[arm] = dict(points=points, mean=[mean(c) for c in zip(*curves)],
                                std=[stdev(c) if len(c) > 1 else 0.0 for c in zip(*curves)])
        for arm in ('plain', 'transfer'):
            zero = [r[f'{arm}_zero_shot_mIoU'] for r in runs]
            summary[arm]['zero_shot_over_teacher'] = mean(zero) / entry['start']['teacher_mIoU']
            reach = []
            for r in runs:  # paired: the softmax arm's final mIoU at the same seed
                target = r['softmax_curve'][-1]
                values = [r[f'{arm}_zero_shot_mIoU']] + r[f'{arm}_curve']
                reach.append(iterations_to_reach(points, values, target))
            summary[arm]['iters_to_softmax'] = reach
        summary['transfer_seconds'] = mean(r['transfer_report']['seconds'] for r in runs)
        entry['summary'] = summary
    return saved


def write_outputs(saved: dict, out: str) -> None:
    saved = summarise(saved)
    os.makedirs(out, exist_ok=True)
    stem = osp.join(out, 'linearize')
    report.write_json(stem + '.json', saved)
    lines = ['# Linearizing a softmax-trained model: plain swap vs attention transfer', '',
             'Per teacher: trained once with softmax (seed 0), then per seed the three arms at '
             'equal labelled budget; mIoU on the validation images; zero-shot: the swapped '
             'model before fine-tuning. Every run in its own process.', '']
    for teacher, entry in saved['teachers'].items():
        spec, start = entry['spec'], entry['start']
        lines += [f"## {spec['label']}", '',
                  f"Teacher: {spec['pretrain_iters']} iterations, mIoU "
                  f"{start['teacher_mIoU']:.2f}" + (
                      f"; the control (no token mixing) {start['control_mIoU']:.2f} (gap "
                      f"{start['gap']:+.2f}, required {REQUIRED_GAP:.0f}: "
                      f"{'holds' if start['calibrated'] else 'does NOT hold'}; its convolutions "
                      f"reach {start['control_conv_reach_px']} px)" if 'gap' in start else '')
                  + f". Transfer: {spec['transfer_iters']} iterations; fine-tuning: "
                  f"{spec['finetune_iters']} at lr {spec['finetune_lr']:g}.", '']
        summary = entry.get('summary')
        if not summary:
            lines += ['No arm ran (calibration failed).', '']
            continue
        points = summary['softmax']['points']
        lines += report.markdown_table(
            ['arm'] + [f'mIoU at {p}' for p in points] + ['zero-shot / teacher',
                                                          'labelled iters to softmax-continued'],
            [[ARMS[arm]] + [report.pm(m, s)
                            for m, s in zip(summary[arm]['mean'], summary[arm]['std'])]
             + ([f"{100 * summary[arm]['zero_shot_over_teacher']:.1f}%",
                 ', '.join('>' + str(points[-1]) if v is None else str(v)
                           for v in summary[arm]['iters_to_softmax'])]
                if arm != 'softmax' else ['-', '-']) for arm in ARMS])
        lines += ['', f"Transfer time: {summary['transfer_seconds']:.1f} s for "
                      f"{spec['transfer_iters']} iterations (mean over seeds).", '']
        rows = []
        for r in entry['runs']:
            for arm in ('plain', 'transfer'):
                feats = {row['name']: row for row in r[f'{arm}_report']['rows']
                         if row['name'].startswith('features.')}
                rows.append([r['seed'], ARMS[arm].split(',')[0],
                             f"{r[f'{arm}_zero_shot_mIoU']:.2f}"] +
                            [report.fmt(feats[k]['rel_l2_after'], 3) for k in sorted(feats)])
        width = max(len(row) for row in rows) - 3
        lines += report.markdown_table(['seed', 'start', 'zero-shot mIoU'] +
                                [f'feature {i} rel. L2' for i in range(width)], rows)
        lines.append('')
    report.write_markdown(stem + '.md', lines)
    plot(saved, stem + '.png')


def plot(saved: dict, path: str) -> None:
    plt = report.pyplot()
    teachers = [t for t, e in saved['teachers'].items() if e.get('summary')]
    if not teachers:
        return
    fig, axes = plt.subplots(1, len(teachers), figsize=(6 * len(teachers), 4.2), squeeze=False)
    for ax, teacher in zip(axes[0], teachers):
        entry = saved['teachers'][teacher]
        for arm, colour in zip(ARMS, ('tab:orange', 'tab:green', 'tab:blue')):
            s = entry['summary'][arm]
            ax.errorbar(s['points'], s['mean'], yerr=s['std'], marker='o', capsize=3,
                        color=colour, label=ARMS[arm])
        ax.axhline(entry['start']['teacher_mIoU'], color='grey', ls='--', lw=1,
                   label='teacher (softmax)')
        ax.set(xlabel='labelled fine-tuning iterations', ylabel='mIoU',
               title=entry['spec']['label'])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    report.save_figure(fig, path)


def study_arguments(parser: argparse.ArgumentParser, stem: str) -> argparse.Namespace:
    """The options the three attention-transfer studies share (``--seeds``, the iterations of
    each phase, the work and results folders, ``--report-only``), parsed; the iterations given
    override every teacher's."""
    report.add_report_only_argument(parser, stem)
    parser.add_argument('--teachers', nargs='+', choices=list(TEACHERS), default=list(TEACHERS))
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    parser.add_argument('--pretrain-iters', type=int, help='override every teacher\'s')
    parser.add_argument('--transfer-iters', type=int)
    parser.add_argument('--finetune-iters', type=int)
    parser.add_argument('--work-dir', default=osp.join(REPO, 'work_dirs', 'linearize'),
                        help='runs and checkpoints (kept: a rerun of a study starts over)')
    parser.add_argument('--out', default=STUDY_RESULTS)
    args = parser.parse_args()
    for key in ('pretrain_iters', 'transfer_iters', 'finetune_iters'):
        if getattr(args, key) is not None:
            for spec in TEACHERS.values():
                spec[key] = getattr(args, key)
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    args = study_arguments(parser, 'linearize')
    if args.report_only:
        write_outputs(report.read_json(osp.join(args.out, 'linearize.json')), args.out)
        return
    os.makedirs(args.work_dir, exist_ok=True)
    from tqdm import tqdm
    saved = dict(commit=code_version(), teachers={}, seeds=args.seeds)
    started = time.perf_counter()
    for teacher in args.teachers:
        spec = dict(TEACHERS[teacher])
        root = osp.join(args.work_dir, teacher)
        os.makedirs(root, exist_ok=True)
        prepare_data(teacher)
        start = train_teacher(teacher, spec, root)
        entry = saved['teachers'][teacher] = dict(spec=spec, start=start, runs=[])
        print(json.dumps(start), flush=True)
        if start.get('calibrated') is False:
            write_outputs(saved, args.out)
            continue
        for seed in tqdm(args.seeds, desc=teacher):
            entry['runs'].append(one_seed(teacher, spec, seed, start, root))
            saved['wall_seconds'] = round(time.perf_counter() - started, 1)
            write_outputs(saved, args.out)  # an interrupted study keeps what it finished
    write_outputs(saved, args.out)
    print(open(osp.join(args.out, 'linearize.md')).read())


if __name__ == '__main__':
    main()
