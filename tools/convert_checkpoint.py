"""Authors' NaLaFormer classification checkpoint -> backbone-only mmengine checkpoint.

    python tools/convert_checkpoint.py SRC DST [--arch t] [--ema]

The result is ``{'state_dict': <backbone tensors>, 'meta': {...}}``: the classification tail is
dropped, the ``layers.{i}.RoPE.angle`` frequency buffers are kept so that every later load checks
them again. It is verified by loading it into a NaLaFormer of ``--arch`` with the released
kernel (every backbone tensor must be present and fit, and the RoPE frequencies must match).
"""
import argparse

import torch
from mmengine.runner.checkpoint import CheckpointLoader

from nala_mm.models import NaLaFormer, load_authors_checkpoint
from nala_mm.models.checkpoint_filter import TAIL_PREFIXES, backbone_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help="the authors' checkpoint ({'model': ..., 'model_ema': ...})")
    parser.add_argument('dst', help='output path')
    parser.add_argument('--arch', default='t', help='variant to verify against: xt, t, s, b, l')
    parser.add_argument('--ema', action='store_true', help="use the 'model_ema' weights")
    args = parser.parse_args()
    checkpoint = CheckpointLoader.load_checkpoint(args.src, map_location='cpu')
    state = {k: v for k, v in backbone_weights(checkpoint, use_ema=args.ema).items()
             if not k.startswith(TAIL_PREFIXES)}
    torch.save({'state_dict': state, 'meta': dict(source=args.src, arch=args.arch, ema=args.ema,
                                                  trained_kernel='relu')}, args.dst)
    stats = load_authors_checkpoint(NaLaFormer(arch=args.arch, kernel='relu'), args.dst)
    print(f"wrote {args.dst}: {stats['loaded']} backbone tensors "
          f'({sum(v.numel() for v in state.values()) / 1e6:.2f}M values)')


if __name__ == '__main__':
    main()
