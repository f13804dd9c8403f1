"""Train any mmseg or mmdet config with mmengine's Runner (the upstream tools' CLI).

    python tools/train.py configs/ade20k_nala_upernet.py [--work-dir DIR] [--amp] [--resume [CKPT]]
                          [--compile [whole|regional]]
    torchrun --nproc_per_node=2 tools/train.py CONFIG --launcher pytorch

``--auto-scale-lr`` (as mmdet's train.py): the learning rate is scaled by the run's total batch
(processes x ``train_dataloader.batch_size``) over the recipe's ``auto_scale_lr.base_batch_size``
(mmengine's Runner does the scaling), e.g. 4 GPUs x 2 images on a 16-image recipe halve it.

``--compile`` (or ``--compile whole``) sets the config's ``compile=True``: mmengine compiles the
model's ``train_step`` with ``torch.compile`` (inductor). ``--compile regional`` compiles each
repeated block class of the backbone once instead (:func:`nala_mm.apis.compile.compile_regions`):
a fraction of the compile time, the rest eager. Either way the process runs under
:func:`nala_mm.apis.compile.apply_compile_settings` (changing input sizes train; the recompile limit
raises instead of falling back to eager), validation stays eager, and checkpoints are the eager
model's (no ``_orig_mod.`` prefix). ``docs/reports/speed.md`` says what compiles and what it gains.
"""
import argparse
import os

from mmengine.config import Config, DictAction

from nala_mm import compat
from nala_mm.apis.compile import apply_compile_settings, compile_regions
from nala_mm.apis.config_loading import enable_auto_scale_lr, load_config
from nala_mm.datasets.checks import explained_data_errors
from nala_mm.engine.optimizers import enable_amp

# the host changes this tool relies on (Runner checkpoints under weights-only loading, the atomic
# checkpoint backend): see nala_mm/compat/
compat.install()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a segmentor or detector')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or from the latest checkpoint in the work dir '
                             'when no path is given')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision (fp16 + loss scaling on GPU, bf16 on CPU)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help="scale the learning rate by the total batch over the config's "
                             'auto_scale_lr.base_batch_size (the recipe\'s batch)')
    parser.add_argument('--compile', nargs='?', const='whole', choices=['whole', 'regional'],
                        help="torch.compile the training step (whole: the config's "
                             'compile=True) or each repeated block class of the backbone once '
                             '(regional)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, e.g. train_cfg.max_iters=100')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config, args.launcher, args.cfg_options, args.work_dir)
    if args.amp:
        enable_amp(cfg)
    if args.compile == 'whole':
        cfg.compile = True  # the optimizer update stays eager: nala_mm/compat/eager_updates.py
        cfg.custom_hooks = [*cfg.get('custom_hooks', []), dict(type='EagerOptimizerUpdatesHook')]
    if args.auto_scale_lr:
        enable_auto_scale_lr(cfg)
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def main() -> None:
    args = parse_args()
    cfg = build_config(args)
    if args.compile:
        apply_compile_settings()
    loaders = ('train_dataloader', 'val_dataloader') if cfg.get('val_cfg') else \
        ('train_dataloader',)
    runner = compat.build_runner(cfg, loaders)
    if args.compile == 'regional':
        regions = compile_regions(runner.model)
        runner.logger.info(f'compiled regionally: {regions}')
    with explained_data_errors(cfg, loaders):
        runner.train()


if __name__ == '__main__':
    main()
