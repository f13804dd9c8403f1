"""Authors' NaLaFormer classification checkpoint -> backbone-only mmengine checkpoint.

    python tools/convert_checkpoint.py SRC DST [--arch t] [--ema]

The result is ``{'state_dict': <backbone tensors>, 'meta': {...}}``, filtered by
:func:`nala_mm.models.checkpoint_filter` against a NaLaFormer of ``--arch`` built as the authors
trained it (every backbone tensor must be present and fit, the RoPE frequencies must match). The
classification tail is dropped; the ``layers.{i}.RoPE.angle`` frequency buffers are kept, so that
every later load checks them again.
"""
import argparse

import torch
from mmengine.runner.checkpoint import CheckpointLoader

from nala_mm import compat
from nala_mm.models import PRETRAINED, NaLaFormer, checkpoint_filter

# weights-only loading of the authors' files (their command line, an argparse.Namespace, is
# allow-listed): nala_mm/compat/safe_globals.py
compat.install()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help="the authors' checkpoint ({'model': ..., 'model_ema': ...})")
    parser.add_argument('dst', help='output path')
    parser.add_argument('--arch', default='t', choices=sorted(PRETRAINED),
                        help='variant the checkpoint belongs to')
    parser.add_argument('--ema', action='store_true', help="use the 'model_ema' weights")
    args = parser.parse_args()
    authors = PRETRAINED[args.arch]
    model = NaLaFormer(arch=args.arch, mixers=authors.trained_mixers())
    checkpoint = CheckpointLoader.load_checkpoint(args.src, map_location='cpu')
    state = checkpoint_filter(checkpoint, model, use_ema=args.ema, keep_rope=True,
                              source=f'checkpoint {args.src}')
    torch.save({'state_dict': state,
                'meta': dict(source=args.src, arch=args.arch, ema=args.ema,
                             trained_kernel=authors.trained_kernel)}, args.dst)
    rope = [key for key in state if key.endswith('.RoPE.angle')]
    values = sum(v.numel() for k, v in state.items() if k not in rope)
    print(f'wrote {args.dst}: {len(state) - len(rope)} backbone tensors ({values / 1e6:.2f}M '
          f'values) and {len(rope)} RoPE frequency buffers')


if __name__ == '__main__':
    main()
