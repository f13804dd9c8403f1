"""Linearize a softmax-trained model: train the NaLa mixers of a swapped config to reproduce its
stock backbone's blocks, without labels (attention transfer, nala_mm.apis.linearize;
docs/user_guides/linearize.md).

    python tools/linearize.py CONFIG CHECKPOINT --out OUT.pth [--iters N] [--lr LR]
        [--report FILE.json] [--target block|attention] [--inputs teacher|sequence]
        [--params mixer|new] [--held-out K] [--teacher-config CONFIG] [--device cpu|cuda]
        [--cfg-options k=v ...]

CONFIG is a swapped config (configs/swap/ or your own with a NaLa* backbone of
nala_mm.models.swap). CHECKPOINT is the stock model's (or, with ``--teacher-config``, the model
of that config: ViTDet's stock layout, whose teacher keeps its windows):

* a whole segmentor or detector of the stock config (keys ``backbone.*`` and the heads): OUT is
  the whole swapped model with the teacher's heads, for ``load_from`` (or ``tools/test.py``);
* a backbone alone, as a stock config's ``init_cfg`` loads (ImageNet weights): OUT is a
  backbone checkpoint in the swapped model's own layout, for
  ``model.backbone.init_cfg=dict(type='Pretrained', checkpoint=OUT)``; it reloads exactly.

The images come from CONFIG's training dataloader through the model's data preprocessor
(labels unused). The report (JSON, default ``OUT`` with ``.json``) holds, per swapped block and
per returned feature map, the relative L2 error against the teacher before and after, on
``--held-out`` training batches drawn first, and the iterations and seconds; the same table is
printed.
"""
import argparse
import itertools
import json
import os
import os.path as osp
import sys

import torch
from mmengine.config import DictAction
from mmengine.logging import print_log
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

from nala_mm import compat
from nala_mm.apis.config_loading import build_model, load_config
from nala_mm.apis.linearize import (
    INPUTS,
    PARAMS,
    TARGETS,
    TransferOptions,
    build_teacher,
    linearize,
    load_swapped_teacher,
    load_teacher,
    split_whole_model,
    swapped_blocks,
)
from nala_mm.models.swap import SwappedAttentionMixin

DEFAULTS = TransferOptions()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='a swapped config (NaLa in a stock backbone)')
    parser.add_argument('checkpoint', help="the stock model's checkpoint (whole model or "
                                           'backbone)')
    parser.add_argument('--out', required=True, help='where the linearized checkpoint goes')
    parser.add_argument('--iters', type=int, default=DEFAULTS.iters)
    parser.add_argument('--lr', type=float, default=DEFAULTS.lr)
    parser.add_argument('--target', choices=TARGETS, default=DEFAULTS.target,
                        help="reproduce each block's output or its attention module's")
    parser.add_argument('--inputs', choices=INPUTS, default=DEFAULTS.inputs,
                        help="each block on the teacher's input, or the student in sequence")
    parser.add_argument('--params', choices=PARAMS, default=DEFAULTS.params,
                        help="train every mixer parameter, or only those the swap added")
    parser.add_argument('--held-out', type=int, default=4,
                        help='training batches, drawn first, on which the errors are reported')
    parser.add_argument('--report', help='the JSON report (default: OUT with .json)')
    parser.add_argument('--teacher-config',
                        help="the config CHECKPOINT was trained with, when its backbone is not "
                             "CONFIG's stock parent (ViTDet's windows: "
                             'configs/swap/coco_vitdet-b_mask-rcnn_lsj-100e.py)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, e.g. train_dataloader.batch_size=2')
    return parser.parse_args(argv)


def build(cfg, device: str):
    """The swapped model of the config, without any pretrained initialisation (the weights
    come from CHECKPOINT), SyncBN as BN (one process)."""
    backbone = cfg.model.backbone
    backbone.pop('init_cfg', None)
    backbone.pop('pretrained', None)
    cfg.model.pop('pretrained', None)
    model = build_model(cfg).to(device)
    if not isinstance(model.backbone, SwappedAttentionMixin):
        raise SystemExit(f'{cfg.filename}: the backbone is {type(model.backbone).__name__}, not '
                         f'a stock backbone with NaLa swapped in; linearize takes a swapped '
                         f'config (configs/swap/, a NaLa* backbone of nala_mm.models.swap)')
    swapped_blocks(model.backbone)  # raises when no block is swapped
    return model


def load_student(model, checkpoint: dict, whole: bool, source: str) -> None:
    """The carried weights into the student backbone (the log lists carried, dropped and new
    tensors per unit) and, for a whole-model checkpoint, its heads into the model."""
    student = model.backbone
    state, report = student.carry_over_checkpoint(checkpoint, source)
    missing, _ = student.load_state_dict(state, strict=False)
    new = {t.split('[')[0] for entries in report.new.values() for t in entries}
    unexplained = [k for k in missing if k not in new]
    if unexplained:
        raise ValueError(f'{source}: backbone tensors neither in the checkpoint nor new in the '
                         f'mixers: {unexplained[:6]}')
    print_log('carried into the swapped units:\n  ' + '\n  '.join(
        report.lines(student.swapped_names, student.mixer_unit)), logger='current')
    if whole:
        _, full = split_whole_model(checkpoint)
        heads = {k: v for k, v in full.items() if not k.startswith('backbone.')}
        missing, unexpected = model.load_state_dict(heads, strict=False)
        missing = [k for k in missing if not k.startswith('backbone.')]
        if missing or unexpected:
            raise ValueError(f'{source}: its heads do not fit the config\'s: missing '
                             f'{missing[:6]}, unexpected {unexpected[:6]}')


def image_batches(cfg, model, device: str):
    """An endless stream of preprocessed training images (the labels are not used)."""
    if cfg.get('train_dataloader') is None:
        raise SystemExit(f'{cfg.filename} has no train_dataloader: linearize trains on the '
                         f'images of the training set; give one (or --cfg-options '
                         f'train_dataloader.dataset.data_root=...)')
    loader = Runner.build_dataloader(cfg.train_dataloader, seed=cfg.get('randomness', {})
                                     .get('seed', 0))
    stream = itertools.cycle(loader)
    preprocessor = model.data_preprocessor

    def next_batch() -> torch.Tensor:
        with torch.no_grad():
            return preprocessor(next(stream), True)['inputs'].to(device)
    return next_batch


def main(argv=None) -> None:
    args = parse_args(argv)
    compat.install()  # checkpoints saved by the project's runs load weights-only
    options = TransferOptions(iters=args.iters, lr=args.lr, target=args.target,
                              inputs=args.inputs, params=args.params)
    if not osp.isfile(args.checkpoint) and '://' not in args.checkpoint:
        raise SystemExit(f'checkpoint {args.checkpoint} does not exist')
    cfg = load_config(args.config, cfg_options=args.cfg_options)
    model = build(cfg, args.device)
    checkpoint = CheckpointLoader.load_checkpoint(args.checkpoint, map_location='cpu')
    whole, _ = split_whole_model(checkpoint)
    if args.teacher_config:
        teacher = build(load_config(args.teacher_config, cfg_options=args.cfg_options),
                        args.device).backbone
        load_swapped_teacher(teacher, checkpoint, args.checkpoint)
    else:
        teacher = build_teacher(model.backbone, cfg.model.backbone).to(args.device)
        load_teacher(teacher, model.backbone, checkpoint, args.checkpoint)
    load_student(model, checkpoint, whole, args.checkpoint)
    batches = image_batches(cfg, model, args.device)
    held_out = [batches() for _ in range(args.held_out)]
    result = linearize(teacher, model.backbone, batches, held_out, options)

    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    meta = dict(linearized_from=args.checkpoint, config=args.config, options=result['options'],
                whole_model=whole)
    state = model.state_dict() if whole else model.backbone.state_dict()
    torch.save(dict(state_dict={k: v.cpu() for k, v in state.items()}, meta=meta), args.out)
    report = args.report or osp.splitext(args.out)[0] + '.json'
    with open(report, 'w') as f:
        json.dump(dict(result, **meta, out=args.out), f, indent=2)
    how = 'load_from' if whole else 'model.backbone.init_cfg'
    print(f'linearized {"model" if whole else "backbone"} written to {args.out} (use it as '
          f'{how}); report {report}', file=sys.stderr)


if __name__ == '__main__':
    main()
