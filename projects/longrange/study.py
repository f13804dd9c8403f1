"""Token mixers on the long-range exemplar task, at equal budget, with a control that mixes no
tokens, and the attention statistics of one trained model per mixer (the paper's Figure 1).

The task (projects.longrange.data, this project's README): look-alike objects in two colours
whose class says whether they match the colour of an exemplar at least 36 px away; the
long-range config (configs/ade20k_longrange_segformer.py here) decodes only the stride-4
features with 1x1 convolutions, so no convolution reaches the exemplar from an object and only
the stage-1 token mixer can carry the answer. Each (variant, seed) trains from scratch in its
own process through tools/train.py (every mixer has the same parameters; a seed fixes the
initial weights and the data order) and is evaluated once on the 100 validation images. The
first seed's model of every variant then goes through the attention analysis
(nala_mm.analysis.analyze_backbone) on one validation image, in a fresh process: Spearman(entropy,
||q||) per layer, NaLa's exponent saturation, and how much of an object's attention row lands on
the exemplar (projects.longrange.data.exemplar_mass), for objects that match it and objects
that do not. Before the runs, the control model's receptive field
(benchmarks.lib.receptive_field) is checked to fall short of the exemplar.

Results: projects/longrange/results/longrange.{json,md,png} (every run in the JSON).

    python -m projects.longrange.study           # 9 variants x 3 seeds
    python -m projects.longrange.study --variants softmax identity --seeds 0 1   # calibration
    python -m projects.longrange.study --mixer "dict(type='MyMixer', k=2)" --out /tmp/mine
    python -m projects.longrange.study --report-only             # table and plot from the JSON
"""
import argparse
import ast
import json
import os
import os.path as osp
import tempfile
import time
from statistics import mean, stdev
from typing import Dict, List, Optional, Tuple

from benchmarks.lib import report
from benchmarks.lib.paths import REPO
from benchmarks.lib.presets import PRESETS, MixerPreset
from benchmarks.lib.runs import mixer_sweep_config, train_config
from nala_mm.analysis.measure import add_case_argument, print_case_result, run_case

PROJECT = osp.dirname(osp.abspath(__file__))
# the committed results of the study and of the graded sweep (graded.py)
RESULTS = osp.join(PROJECT, 'results')
CONFIG_PATH = osp.join(PROJECT, 'configs', 'ade20k_longrange_segformer.py')
CONTROL, REFERENCE = 'identity', 'softmax'
# the task needs attention when softmax beats the control by this much at every seed
REQUIRED_GAP = 15.0
# per training process (runs go one at a time): one thread keeps its speed beside other jobs
# on a small machine, where more threads per run slow down several-fold
THREADS = 1
VARIANTS: Dict[str, MixerPreset] = PRESETS
# the attention-row picture: one query, these mixers side by side
PICTURE = ('nala-cosine', 'linear-relu', 'softmax')
STATS_INDEX = 0  # the validation image the attention analysis and the picture use


def parse_mixer(text: str) -> dict:
    """``--mixer``: a Python dict literal (``{'type': 'X'}``) or ``dict(type='X', ...)`` call,
    evaluated without running code."""
    tree = ast.parse(text, mode='eval').body
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and \
            tree.func.id == 'dict' and not tree.args:
        value = {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords}
    else:
        value = ast.literal_eval(tree)
    if not isinstance(value, dict) or 'type' not in value:
        raise argparse.ArgumentTypeError(f"--mixer must be a mixer config with a 'type', such "
                                         f"as \"dict(type='LinearAttention')\", got {text!r}")
    return value


def config_text(mixer: dict, seed: int, iters: int) -> str:
    return mixer_sweep_config(CONFIG_PATH, mixer, seed, iters, log_every=100)


# ------------------------------------------------------------------------------ one run
def run_one(variant: str, mixer: dict, seed: int, iters: int, work_root: str) -> dict:
    name = f'{variant}_seed{seed}'
    run = train_config(config_text(mixer, seed, iters), name, work_root)
    if 'error' in run:
        return dict(variant=variant, seed=seed, error=run['error'])
    records = run['records']
    val = [r for r in records if 'mIoU' in r][-1]
    # mmengine logs the mean iteration time of each logging window; the first window holds
    # start-up (data workers, first allocations)
    times = [r['time'] for r in records if 'time' in r and 'loss' in r]
    result = dict(variant=variant, seed=seed, iters=iters, mIoU=val['mIoU'], aAcc=val['aAcc'],
                  mAcc=val['mAcc'], sec_per_iter=mean(times[1:] or times),
                  wall_seconds=run['wall_seconds'],
                  final_loss=[r['loss'] for r in records if 'loss' in r][-1])
    result.update(per_class_iou(osp.join(work_root, name)))
    return result


def per_class_iou(work_dir: str) -> dict:
    """Per-class IoU from the run's log (mmseg prints it as a table; scalars.json has only the
    means), and the mean over the two object classes."""
    from .data import LONGRANGE_CLASSES
    logs = [osp.join(root, f) for root, _, files in os.walk(work_dir) for f in files
            if f.endswith('.log')]
    ious = {}
    for path in logs:
        with open(path) as f:
            for line in f:
                cells = [c.strip() for c in line.strip().strip('|').split('|')]
                if len(cells) >= 3 and cells[0] in LONGRANGE_CLASSES:
                    try:
                        ious[cells[0]] = float(cells[1])
                    except ValueError:
                        continue
    if set(ious) != set(LONGRANGE_CLASSES):
        return {}
    objects = [ious[c] for c in LONGRANGE_CLASSES[1:]]
    return dict(per_class_IoU=ious, object_mIoU=mean(objects))


# ------------------------------------------------------------------------------ attention
def stats_case(config: str, checkpoint: str, image: str, seed: int,
               exemplar_px: Optional[int] = None) -> dict:
    """Child process: Figure-1 statistics of every attention layer of one trained model on one
    validation image, and the attention rows of its objects' centres (``exemplar_px``: the
    band's thickness the data were generated with, the task's own by default)."""
    import mmcv
    import torch
    from mmengine.runner import load_checkpoint

    from nala_mm import compat
    from nala_mm.analysis import analyze_backbone, preprocess
    from nala_mm.apis.config_loading import build_model_from_config

    from .data import (
        EXEMPLAR_PX,
        MATCH_CLASS,
        exemplar_mass,
        sample_scene,
        scene_rng,
    )

    torch.set_num_threads(THREADS)
    compat.install()
    model, _ = build_model_from_config(config)
    load_checkpoint(model, checkpoint, map_location='cpu', logger='silent')
    bgr = mmcv.imread(image)
    height, width = bgr.shape[:2]
    index = int(osp.splitext(osp.basename(image))[0].rsplit('_', 1)[1])
    scene = sample_scene(scene_rng(seed, 1, index), height, width,  # 1: the validation split
                         exemplar_px or EXEMPLAR_PX)
    points = [(float(o.cx), float(o.cy)) for o in scene.objects]
    matches = [scene.object_class(o) == MATCH_CLASS for o in scene.objects]
    entries, maps = [], {}
    analysed = analyze_backbone(model.backbone, preprocess(model, bgr), points, (height, width))
    for name, stats in analysed.items():
        entry = stats.summary(name)
        entry.update(exemplar_mass(scene, stats.maps, stats.grid))
        entries.append(entry)
        if entry['stage'] == 0:  # the trained layer's rows, for the picture (4 digits suffice)
            maps[name] = [[[float(f'{w:.4g}') for w in row] for row in m] for m in stats.maps]
    return dict(image=image, points=points, matches=matches, layers=entries, maps=maps,
                exemplar_box=list(scene.exemplar_box))


def control_reach() -> int:
    """How far (Chebyshev, px) the input pixels that can change a pixel's logits lie from it in
    the long-range config's control model, randomly initialised
    (:func:`~benchmarks.lib.receptive_field.conv_reach`)."""
    from benchmarks.lib.receptive_field import conv_reach
    from nala_mm.apis.config_loading import build_model_from_config

    from .data import DEFAULT_SIZE
    model, _ = build_model_from_config(
        CONFIG_PATH, {'model.backbone.mixers': [dict(PRESETS[CONTROL].mixer)] * 4})
    model.init_weights()
    return conv_reach(model, DEFAULT_SIZE)


def attention_stats(variant: str, config: str, checkpoint: str, image: str,
                    seed: int) -> dict:
    """:func:`stats_case` in a fresh process (a trained model per variant, none kept here)."""
    result = run_case(__spec__.name, dict(config=config, checkpoint=checkpoint, image=image,
                                          seed=seed),
                      env=dict(PYTHONWARNINGS='ignore',
                               PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', '')))
    return dict(variant=variant, error=result['error']) if 'error' in result else \
        dict(result, variant=variant)


# ------------------------------------------------------------------------------ summary
def paired(by_seed: Dict[Tuple[str, int], float], variant: str, other: str,
           seeds: List[int]) -> List[float]:
    return [by_seed[variant, s] - by_seed[other, s] for s in seeds
            if (variant, s) in by_seed and (other, s) in by_seed]


def summarise(runs: List[dict], labels: Dict[str, str]) -> Dict[str, dict]:
    summary = {}
    by_seed = {(r['variant'], r['seed']): r['mIoU'] for r in runs if 'mIoU' in r}
    for variant in dict.fromkeys(r['variant'] for r in runs):
        ok = [r for r in runs if r['variant'] == variant and 'mIoU' in r]
        seeds = [r['seed'] for r in ok]
        values = [r['mIoU'] for r in ok]
        objects = [r['object_mIoU'] for r in ok if 'object_mIoU' in r]
        row = dict(label=labels.get(variant, variant), runs=len(ok),
                   mIoU_mean=mean(values) if values else None,
                   mIoU_std=stdev(values) if len(values) > 1 else None,
                   object_mIoU_mean=mean(objects) if objects else None,
                   object_mIoU_std=stdev(objects) if len(objects) > 1 else None,
                   # best of the seeds: on a shared machine a run slowed by another job would
                   # otherwise set its variant's speed
                   sec_per_iter_best=min(r['sec_per_iter'] for r in ok) if ok else None)
        # paired at the same seed (same initial weights of everything but the mixer's math, same
        # data order): seed-to-seed variation cancels
        for other, key in ((CONTROL, 'vs_control'), (REFERENCE, 'vs_softmax')):
            deltas = paired(by_seed, variant, other, seeds)
            row[f'{key}_deltas'] = deltas
            row[f'{key}_mean'] = mean(deltas) if deltas else None
            row[f'{key}_std'] = stdev(deltas) if len(deltas) > 1 else None
        summary[variant] = row
    return summary


def control_gaps(summary: Dict[str, dict]) -> Optional[dict]:
    """Softmax minus control at each seed, and whether every gap reaches the threshold."""
    if REFERENCE not in summary or not summary[REFERENCE]['vs_control_deltas']:
        return None
    gaps = summary[REFERENCE]['vs_control_deltas']
    return dict(gaps=gaps, required=REQUIRED_GAP, holds=all(g >= REQUIRED_GAP for g in gaps))


def percent(value: Optional[float]) -> str:
    return '-' if value is None else f'{100 * value:.1f}%'


def stats_rows(saved: dict) -> List[List[str]]:
    """The attention table's rows: every layer of one trained model per mixer."""
    labels = {v: s['label'] for v, s in saved['summary'].items()}
    rows = []
    for variant, result in saved.get('attention', {}).items():
        label = labels.get(variant, variant)
        if 'error' in result:
            rows.append([label, f"error: {result['error']}"] + [''] * 5)
            continue
        for layer in result['layers']:
            rho = layer['spearman_entropy_vs_qnorm']
            rows.append([f"{label}, {layer['layer']}", '-' if rho is None else f'{rho:+.3f}',
                         f"{layer['qnorm_mean']:.2f}", percent(layer.get('saturated_share')),
                         percent(layer['exemplar_mass_match']),
                         percent(layer['exemplar_mass_other']),
                         percent(layer['exemplar_token_share'])])
    return rows


def summary_row(row: dict) -> List[str]:
    """A mixer's line of the main table."""
    cells = [row['label'], str(row['runs']), report.pm(row['mIoU_mean'], row['mIoU_std']),
             report.pm(row['object_mIoU_mean'], row['object_mIoU_std'])]
    for key in ('vs_control', 'vs_softmax'):
        deltas = row[f'{key}_deltas']
        cells.append('-' if not deltas else report.pm(row[f'{key}_mean'], row[f'{key}_std'], True)
                     + f' ({report.signed(deltas)})')
    cells.append('-' if row['sec_per_iter_best'] is None else f"{row['sec_per_iter_best']:.2f}")
    return cells


def run_row(r: dict) -> List[str]:
    """A run's line of the per-run table."""
    if 'mIoU' not in r:
        return [r['variant'], r['seed'], '-', '-', '-', f"error: {r['error']}", '-']
    obj = '-' if 'object_mIoU' not in r else f"{r['object_mIoU']:.2f}"
    return [r['variant'], r['seed'], f"{r['mIoU']:.2f}", obj, f"{r['aAcc']:.2f}",
            f"{r['final_loss']:.3f}", f"{r['sec_per_iter']:.2f}"]


def write_outputs(saved: dict, stem: str) -> None:
    runs, summary = saved['runs'], saved['summary']
    report.write_json(stem + '.json', saved)
    gaps = saved.get('control_gap')
    lines = ['# Token mixers on the long-range exemplar task', '',
             f"{saved['config']}, one mixer in all four stages, from scratch, {saved['iters']} "
             f"iterations of batch 4 at 128x128, seeds {saved['seeds']}; mIoU on the 100 "
             f"validation images (object mIoU: the two classes, 'matches the exemplar' and "
             f"'differs'; a model blind to the exemplar scores {saved['chance_mIoU']:.2f} mIoU "
             f'at chance); time per training iteration on this CPU, one thread.', '']
    if gaps:
        lines += [f"Softmax minus control at each seed: {report.signed(gaps['gaps'])} "
                  "(required: every "
                  f"gap >= {gaps['required']:.0f}; "
                  f"{'holds' if gaps['holds'] else 'does NOT hold'}).", '']
    lines += report.markdown_table(
        ['mixer', 'runs', 'mIoU mean ± std', 'object mIoU mean ± std',
         '− control, same seed (per seed)', '− softmax, same seed (per seed)',
         's / iter (best seed)'], [summary_row(row) for row in summary.values()])
    if saved.get('attention'):
        lines += ['', f"## Attention of one trained model per mixer (seed {saved['seeds'][0]}, "
                      f"{saved['stats_image']})", '',
                  'Only stage 1 is decoded, so only layers.0 is trained; the other stages '
                  'get no gradient and stay at their initialisation.', '']
        lines += report.markdown_table(
            ['mixer, layer', 'Spearman(entropy, ‖q‖)', 'mean ‖q‖', 'saturated exponent',
             'row on exemplar: matching objects', 'others', 'exemplar token share'],
            stats_rows(saved))
    calibration = saved.get('calibration')
    if calibration:
        lines += ['', '## Calibration (softmax against the control only, before freezing)', '',
                  calibration['note'], '']
        lines += report.markdown_table(
            ['design', 'schedule', 'softmax mIoU', 'control mIoU'],
            [[step['design'], step['schedule'], ', '.join(f'{m:.2f}' for m in step['softmax']),
              ', '.join(f'{m:.2f}' for m in step['control']) or '-']
             for step in calibration['steps']])
    lines += ['']
    lines += report.markdown_table(['mixer', 'seed', 'mIoU', 'object mIoU', 'aAcc', 'final loss',
                             's / iter'], [run_row(r) for r in runs])
    report.write_markdown(stem + '.md', lines)
    plot(saved, stem + '.png')


def plot(saved: dict, path: str) -> None:
    """Top: mIoU per mixer and seed. Below: one object's stage-1 attention row for NaLa, plain
    linear attention and softmax side by side, for a matching and a differing object."""
    import numpy as np
    plt = report.pyplot()
    runs, summary, stats = saved['runs'], saved['summary'], saved.get('attention', {})
    pictured = [v for v in PICTURE if v in stats and 'maps' in stats[v]]
    layer = 'layers.0.blocks.0.attn'
    result = stats[pictured[0]] if pictured else None
    queries = []
    if result:  # the first object that matches the exemplar and the first that does not
        queries = [result['matches'].index(flag) for flag in (True, False)
                   if flag in result['matches']]
    fig = plt.figure(figsize=(12, 4.4 + 3.2 * len(queries)))
    grid = fig.add_gridspec(1 + len(queries), len(pictured) + 1)
    ax = fig.add_subplot(grid[0, :])
    report.seed_scatter(ax, runs, summary, rotation=12)
    ax.axhline(saved['chance_mIoU'], color='grey', ls='--', lw=1,
               label='blind to the exemplar (chance)')
    ax.set_ylabel('mIoU')
    ax.legend(loc='best', fontsize=8)
    ax.set_title(f"long-range exemplar task, {saved['iters']} iterations (dots: seeds, "
                 f'squares: mean ± std)')
    ax.grid(True, axis='y', alpha=0.3)
    if result:
        from .data import validation_image
        image = validation_image(STATS_INDEX)  # result['image'], as the data hold it
        height, width = image.shape[:2]
        ey0, ex0, ey1, ex1 = result['exemplar_box']
        for row, query in enumerate(queries, start=1):
            x, y = result['points'][query]
            kind = 'matches' if result['matches'][query] else 'differs'
            ax = fig.add_subplot(grid[row, 0])
            ax.imshow(image)
            ax.plot(x, y, marker='x', color='black', mew=3, markersize=11)
            ax.plot(x, y, marker='x', color='white', mew=1.5, markersize=9)
            ax.set_title(f'query: an object that {kind}\n(the exemplar is the framed band)',
                         fontsize=8)
            ax.axis('off')
            for col, variant in enumerate(pictured, start=1):
                weights = np.asarray(stats[variant]['maps'][layer][query])
                ax = fig.add_subplot(grid[row, col])
                ax.imshow(image, alpha=0.35)
                limit = float(np.abs(weights).max()) or 1.0
                ax.imshow(weights, cmap='RdBu_r', vmin=-limit, vmax=limit, alpha=0.8,
                          extent=(-0.5, width - 0.5, height - 0.5, -0.5))
                ax.add_patch(plt.Rectangle(
                    (ex0 - 0.5, ey0 - 0.5), ex1 - ex0, ey1 - ey0, fill=False, color='black',
                    lw=0.8))
                ax.set_title(f"{summary.get(variant, {}).get('label', variant)}\n"
                             f'stage-1 row (RoPE on, mean over heads)', fontsize=8)
                ax.axis('off')
    report.save_figure(fig, path, dpi=110)


# ------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--variants', nargs='+', choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument('--mixer', type=parse_mixer, action='append', default=[],
                        metavar='DICT', help="a mixer config of your own, e.g. \"dict(type="
                        "'LinearAttention', feature_map='elu')\"; repeatable; runs as "
                        "'custom-<i>' beside --variants")
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    # the schedule of the committed results (results/longrange.json)
    parser.add_argument('--iters', type=int, default=1500)
    parser.add_argument('--no-stats', action='store_true',
                        help='skip the attention analysis of the first seed')
    parser.add_argument('--out', default=RESULTS)
    report.add_report_only_argument(parser, 'longrange')
    parser.add_argument('--calibration', metavar='JSON',
                        help='with --report-only: store this calibration record (the designs '
                             'tried, softmax against the control) in OUT/longrange.json')
    add_case_argument(parser)
    args = parser.parse_args()
    if args.case is not None:
        print_case_result(stats_case(**args.case))
        return
    stem = osp.join(args.out, 'longrange')
    if args.report_only:
        saved = report.read_json(stem + '.json')
        if args.calibration:
            saved['calibration'] = report.read_json(args.calibration)
        write_outputs(saved, stem)
        print(open(stem + '.md').read())
        return

    # each training process (and its BLAS) uses at most THREADS threads
    for var in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS'):
        os.environ[var] = str(THREADS)
    os.chdir(REPO)  # the config's data root is relative to the repository
    from mmengine.config import Config

    from .data import FAR_PX, generate_longrange, local_chance_miou
    cfg = Config.fromfile(CONFIG_PATH)
    data_root = cfg.train_dataloader.dataset.data_root
    data = generate_longrange(data_root, image_size=cfg.image_size)
    variants = {v: VARIANTS[v] for v in args.variants}
    for i, mixer in enumerate(args.mixer):
        variants[f'custom-{i}'] = MixerPreset(label=f'{mixer}', mixer=mixer)
    labels = {v: spec.label for v, spec in variants.items()}
    stats_image = osp.join(data_root, 'images', 'validation', f'ADE_val_{STATS_INDEX:08d}.jpg')
    import torch
    torch.set_num_threads(THREADS)
    reach = control_reach()
    if reach >= FAR_PX:
        raise RuntimeError(f'the control model\'s convolutions reach {reach} px, as far as the '
                           f'exemplar ({FAR_PX} px): the task would not need token mixing')
    saved = dict(config=osp.relpath(CONFIG_PATH, REPO), iters=args.iters, seeds=args.seeds,
                 conv_reach_px=reach, exemplar_distance_px=FAR_PX,
                 threads=THREADS, data=dict(root=data_root, num_train=data['num_train'],
                                            num_val=data['num_val'],
                                            class_pixel_fraction=data['class_pixel_fraction']),
                 chance_mIoU=local_chance_miou(data['class_pixel_fraction']),
                 mixers={v: spec.mixer for v, spec in variants.items()},
                 stats_image=osp.relpath(stats_image, REPO), runs=[], attention={})
    from tqdm import tqdm
    # seeds outermost: an interrupted sweep still has every variant at the first seeds
    cases = [(v, s) for s in args.seeds for v in variants]
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix='nala_longrange_') as work_root:
        for variant, seed in (progress := tqdm(cases, desc='long-range runs')):
            progress.set_postfix_str(f'{variant} seed {seed}')
            run = run_one(variant, variants[variant].mixer, seed, args.iters, work_root)
            saved['runs'].append(run)
            progress.write(json.dumps(run))
            if seed == args.seeds[0] and not args.no_stats and 'mIoU' in run:
                work_dir = osp.join(work_root, f'{variant}_seed{seed}')
                checkpoint = osp.join(work_dir, f'iter_{args.iters}.pth')
                saved['attention'][variant] = attention_stats(
                    variant, osp.join(work_root, f'{variant}_seed{seed}.py'), checkpoint,
                    stats_image, 0)
                if variant not in PICTURE:  # rows are kept for the picture's mixers only
                    saved['attention'][variant].pop('maps', None)
            saved['summary'] = summarise(saved['runs'], labels)
            saved['control_gap'] = control_gaps(saved['summary'])
            saved['sweep_wall_seconds'] = round(time.perf_counter() - start, 1)
            # rewritten after every run: an interrupted sweep leaves the runs it finished
            write_outputs(saved, stem)
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
