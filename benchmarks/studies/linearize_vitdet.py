"""Attention transfer reaches the detector: a tiny stock-layout ViTDet (softmax in windows, two
global SDPA blocks) trained on the generated COCO data, then converted to NaLa in every block by
tools/linearize.py, either by the plain swap (``--iters 0``, weights carried over) or after 800
iterations of attention transfer (the iteration count docs/user_guides/linearize.md measured for
the ViT).
Both are evaluated zero-shot (no labelled fine-tuning): bbox mAP on the validation images, per
seed (the seed sets the transfer's data order). The teacher keeps its windows
(``--teacher-config``). Every run is its own process.

The model: ViTDet's parts at a 2-core CPU's size: patch 16 on 192x192 images (a 12x12 grid),
six blocks in ViTDet's pattern (two windowed blocks of 4x4 windows, then a global one, twice),
SimpleFPN and Mask R-CNN at 64 channels; trained from scratch with LSJ at 192x192 (resize 0.8 to
1.25, crop), AdamW without layer decay (a from-scratch run, not a fine-tuning one), BatchNorm
in SimpleFPN (``CONFIG`` says why).
Results: benchmarks/results/studies/linearize_vitdet.{json,md,png}; discussed in
docs/user_guides/vitdet.md.

    python -m benchmarks.studies.linearize_vitdet
    python -m benchmarks.studies.linearize_vitdet --seeds 0 --pretrain-iters 100 \\
        --transfer-iters 20 --out /tmp/lv
    python -m benchmarks.studies.linearize_vitdet --report-only
"""
import argparse
import os
import os.path as osp
import time
from statistics import mean, stdev

from ..lib import report
from ..lib.evaluation import curve, linearize, test_score
from ..lib.paths import REPO, STUDY_RESULTS
from ..lib.provenance import code_version
from ..lib.runs import schedule, train_config

SWAP = osp.join(REPO, 'configs', 'swap', 'coco_vitdet-b_mask-rcnn_lsj-100e')
# The generated COCO data (nala_mm.datasets.synthetic_coco) at 8x the det demo's training
# images, which the teacher overfits.
DATA = dict(root='data/studies/vitdet_coco/', num_train=960, num_val=60)
METRIC = 'coco/bbox_mAP'
# "Clearly above zero": below this bbox mAP the study stops before the students, whose scores
# would be noise around zero.
CLEAR_MAP = 0.05
SIDE = (192, 192)
WINDOW = dict(type='WindowSoftmaxAttention', window_size=4)
LAYOUTS = {'stock': ([WINDOW] * 2 + ['sdpa']) * 2, 'nala': ['nala'] * 6}
DEFAULTS = dict(pretrain_iters=1000, transfer_iters=800, lr=5e-4)
STARTS = {'plain': 'plain swap', 'transfer': 'swap + attention transfer'}

CONFIG = """_base_ = [{base!r}]
side = {side!r}
data_root = {data_root!r}
metainfo = dict(classes=('disc', 'square', 'triangle', 'star'))
model = dict(
    data_preprocessor=dict(batch_augments=[dict(type='BatchFixedSizePad', size=side,
                                                pad_mask=True)]),
    backbone=dict(img_size=side, embed_dims=96, num_layers=6, num_heads=3, mlp_ratio=4,
                  out_indices=(5,), drop_path_rate=0.1, init_cfg=None, mixers={mixers!r}),
    # BatchNorm in the pyramid: with ViTDet's LayerNorm (LN2d) this tiny detector barely
    # learns within a CPU's schedule
    neck=dict(in_channels=96, out_channels=64, norm_cfg=dict(type='BN')),
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        bbox_head=dict(in_channels=64, conv_out_channels=64, fc_out_channels=256, num_classes=4),
        mask_roi_extractor=dict(out_channels=64),
        mask_head=dict(in_channels=64, conv_out_channels=64, num_classes=4)),
    # two to five objects an image: 300 proposals and 128 sampled RoIs (mmdet's 1000 and 512
    # are sized for COCO's crowds) cut a training step's time threefold here
    train_cfg=dict(rpn_proposal=dict(nms_pre=1000, max_per_img=300),
                   rcnn=dict(sampler=dict(num=128))))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomResize', scale=side, ratio_range=(0.8, 1.25), keep_ratio=True),
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=side, recompute_bbox=True,
         allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=side, keep_ratio=True),
    dict(type='Pad', size=side, pad_val=dict(img=(114, 114, 114))),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False, dataset=dict(
    _delete_=True, type='CocoDataset', data_root=data_root, metainfo=metainfo,
    ann_file='annotations/instances_train2017.json', data_prefix=dict(img='train2017/'),
    filter_cfg=dict(filter_empty_gt=True, min_size=32), pipeline=train_pipeline))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False, dataset=dict(
    data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json', metric='bbox')
test_evaluator = val_evaluator
optim_wrapper = dict(optimizer=dict(lr={lr!r}), paramwise_cfg=dict(decay_rate=1.0))
custom_hooks = []
"""


def config_text(layout: str, seed: int, iters: int, lr: float, val_every=None) -> str:
    """The tiny ViTDet with ``layout`` ('stock' or 'nala'), seeded, trained ``iters``
    iterations (warm-up over the first tenth, then poly decay), evaluated every ``val_every``
    (default: once at the end)."""
    suffix = '' if layout == 'stock' else '_nala-all'
    return CONFIG.format(base=SWAP + suffix + '.py', side=SIDE, data_root=DATA['root'],
                         mixers=LAYOUTS[layout], lr=lr) + schedule(seed, iters, val_every=val_every)


def run(args) -> dict:
    from tqdm import tqdm

    from nala_mm.datasets.synthetic_coco import generate_coco_like
    root = args.work_dir
    os.makedirs(root, exist_ok=True)
    generate_coco_like(osp.join(REPO, DATA['root']), num_train=DATA['num_train'],
                       num_val=DATA['num_val'], image_size=SIDE)
    saved = dict(commit=code_version(), seeds=args.seeds, spec=dict(
        pretrain_iters=args.pretrain_iters, transfer_iters=args.transfer_iters, lr=args.lr,
        side=list(SIDE), layouts=LAYOUTS, data=DATA, clear_map=CLEAR_MAP), runs=[])
    started = time.perf_counter()
    teacher = train_config(config_text('stock', 0, args.pretrain_iters, args.lr,
                                       val_every=args.pretrain_iters // 4), 'teacher', root)
    if 'error' in teacher:
        raise RuntimeError(f'training the teacher: {teacher["error"]}')
    scores = curve(teacher['records'], METRIC)
    if len(scores) < 4 or scores[-1] < CLEAR_MAP:  # an evaluation that detected nothing
        raise RuntimeError(f'the teacher reaches a bbox mAP of {scores} at each quarter of '
                           f'{args.pretrain_iters} iterations, short of {CLEAR_MAP}: train it '
                           f'longer')
    saved['teacher'] = dict(bbox_mAP=scores[-1], curve=scores, seconds=teacher['wall_seconds'])
    print(f"teacher: bbox mAP {saved['teacher']['bbox_mAP']:.3f}", flush=True)
    teacher_cfg = osp.join(root, 'teacher.py')
    checkpoint = osp.join(root, 'teacher', f'iter_{args.pretrain_iters}.pth')
    for seed in tqdm(args.seeds, desc='seeds'):
        swapped_cfg = osp.join(root, f'nala_seed{seed}.py')
        with open(swapped_cfg, 'w') as f:
            f.write(config_text('nala', seed, args.pretrain_iters, args.lr))
        row = dict(seed=seed)
        for start, iters in (('plain', 0), ('transfer', args.transfer_iters)):
            path = osp.join(root, f'{start}_seed{seed}.pth')
            result = linearize(swapped_cfg, checkpoint, path, iters, seed,
                               ['--teacher-config', teacher_cfg])
            blocks = [r for r in result['rows'] if r['name'].startswith('layers.')]
            row[start] = dict(
                bbox_mAP=test_score(swapped_cfg, path, osp.join(root, f'test_{start}_{seed}'),
                                    METRIC),
                seconds=result['seconds'],
                block_rel_l2=[r['rel_l2_after'] for r in blocks])
        saved['runs'].append(row)
        saved['wall_seconds'] = round(time.perf_counter() - started, 1)
        write_outputs(saved, args.out)  # an interrupted study keeps the seeds it finished
    return saved


def summarise(saved: dict) -> dict:
    teacher = saved['teacher']['bbox_mAP']
    summary = {}
    for start in STARTS:
        values = [r[start]['bbox_mAP'] for r in saved['runs']]
        summary[start] = dict(mean=mean(values), std=stdev(values) if len(values) > 1 else 0.0,
                              over_teacher=mean(values) / teacher if teacher else None,
                              seconds=mean(r[start]['seconds'] for r in saved['runs']))
    saved['summary'] = summary
    return saved


def write_outputs(saved: dict, out: str) -> None:
    saved = summarise(saved)
    os.makedirs(out, exist_ok=True)
    stem = osp.join(out, 'linearize_vitdet')
    report.write_json(stem + '.json', saved)
    spec, summary = saved['spec'], saved['summary']
    lines = ['# Linearizing a tiny ViTDet: zero-shot bbox mAP of the plain swap and of '
             'attention transfer', '',
             f"Teacher: the stock layout (windows of 4 on the 12x12 grid, two global SDPA "
             f"blocks, BatchNorm in SimpleFPN), trained {spec['pretrain_iters']} iterations from "
             f"scratch on {spec['data']['num_train']} generated COCO images at "
             f"{spec['side'][0]}x{spec['side'][1]}: bbox mAP on {spec['data']['num_val']} "
             f"validation images "
             f"{saved['teacher']['bbox_mAP']:.3f} (at each quarter of training: "
             f"{', '.join(f'{v:.3f}' for v in saved['teacher']['curve'])}). Converted to NaLa "
             f"in all six blocks by the plain swap or after {spec['transfer_iters']} transfer "
             f"iterations; no labelled fine-tuning. {len(saved['runs'])} seeds.", '']
    lines += report.markdown_table(
        ['start', 'zero-shot bbox mAP', 'zero-shot / teacher', 'conversion seconds'],
        [[STARTS[s], f"{summary[s]['mean']:.3f} ± {summary[s]['std']:.3f}",
          '-' if summary[s]['over_teacher'] is None else
          f"{100 * summary[s]['over_teacher']:.1f}%", report.fmt(summary[s]['seconds'])]
         for s in STARTS])
    lines += ['', 'Per seed: bbox mAP and each block\'s relative L2 error after conversion.', '']
    lines += report.markdown_table(
        ['seed', 'start', 'bbox mAP'] + [f'block {i} rel. L2' for i in range(6)],
        [[r['seed'], STARTS[s], f"{r[s]['bbox_mAP']:.3f}"] +
         [report.fmt(v, 3) for v in r[s]['block_rel_l2']] for r in saved['runs'] for s in STARTS])
    report.write_markdown(stem + '.md', lines)
    plot(saved, stem + '.png')


def plot(saved: dict, path: str) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    names = ['teacher (softmax)'] + [STARTS[s] for s in STARTS]
    values = [saved['teacher']['bbox_mAP']] + [saved['summary'][s]['mean'] for s in STARTS]
    errors = [0.0] + [saved['summary'][s]['std'] for s in STARTS]
    ax.bar(names, values, yerr=errors, capsize=4, color=['tab:blue', 'tab:orange', 'tab:green'])
    ax.set(ylabel='bbox mAP (zero-shot)', title='Tiny ViTDet: softmax to NaLa in every block')
    ax.grid(True, axis='y', alpha=0.3)
    report.save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_report_only_argument(parser, 'linearize_vitdet')
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    parser.add_argument('--pretrain-iters', type=int, default=DEFAULTS['pretrain_iters'])
    parser.add_argument('--transfer-iters', type=int, default=DEFAULTS['transfer_iters'])
    parser.add_argument('--lr', type=float, default=DEFAULTS['lr'])
    parser.add_argument('--work-dir', default=osp.join(REPO, 'work_dirs', 'linearize_vitdet'))
    parser.add_argument('--out', default=STUDY_RESULTS)
    args = parser.parse_args()
    if args.report_only:
        write_outputs(report.read_json(osp.join(args.out, 'linearize_vitdet.json')), args.out)
        return
    run(args)
    print(open(osp.join(args.out, 'linearize_vitdet.md')).read())


if __name__ == '__main__':
    main()
