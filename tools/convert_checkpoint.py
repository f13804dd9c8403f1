"""Authors' NaLaFormer classification checkpoint -> backbone-only mmengine checkpoint.

    python tools/convert_checkpoint.py SRC DST [--arch t] [--ema]

The result is ``{'state_dict': <backbone tensors>, 'meta': {...}}``; it is verified by loading
it into a NaLaFormer of ``--arch`` (every backbone tensor must be present and fit).
"""
import argparse

import torch
from mmengine.runner.checkpoint import CheckpointLoader

from nala_mm.models import NaLaFormer, filter_authors_checkpoint, load_authors_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help="the authors' checkpoint ({'model': ..., 'model_ema': ...})")
    parser.add_argument('dst', help='output path')
    parser.add_argument('--arch', default='t', help='variant to verify against: xt, t, s, b, l')
    parser.add_argument('--ema', action='store_true', help="use the 'model_ema' weights")
    args = parser.parse_args()
    checkpoint = CheckpointLoader.load_checkpoint(args.src, map_location='cpu')
    state = filter_authors_checkpoint(checkpoint, use_ema=args.ema)
    torch.save({'state_dict': state,
                'meta': dict(source=args.src, arch=args.arch, ema=args.ema)}, args.dst)
    stats = load_authors_checkpoint(NaLaFormer(arch=args.arch), args.dst)
    print(f"wrote {args.dst}: {stats['loaded']} backbone tensors "
          f'({sum(v.numel() for v in state.values()) / 1e6:.2f}M values)')


if __name__ == '__main__':
    main()
