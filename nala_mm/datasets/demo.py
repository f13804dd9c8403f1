"""The demos' generated data, from the command line, where the demo configs read it.

    python -m nala_mm.datasets.demo seg    # data/demo/ade/ADEChallengeData2016 (ADE20K layout)
    python -m nala_mm.datasets.demo det    # data/demo/coco (COCO layout)
    python -m nala_mm.datasets.demo seg --num-train 8 --num-val 2 --size 96 96   # a quick set

Paths are relative to the working directory, as the configs' ``data_root``: run it where you
train (``mim train nala_mm ade20k_demo_nala_upernet.py`` then finds the data). The full sets are
what ``make demo`` / ``make demo-det`` train on; generation is deterministic and skipped when the
same set is already there.
"""
import argparse
from typing import Optional, Sequence

from .synthetic_ade import generate_ade_like
from .synthetic_coco import generate_coco_like

# task -> (generator, the demo config's data_root, default counts and size)
DEMO_DATA = {
    'seg': (generate_ade_like, 'data/demo/ade/ADEChallengeData2016', 160, 40, (160, 160)),
    'det': (generate_coco_like, 'data/demo/coco', 120, 30, (192, 192)),
}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m nala_mm.datasets.demo',
        description="Generate the demos' data (ADE20K or COCO layout) where their configs "
                    'read it')
    parser.add_argument('task', choices=sorted(DEMO_DATA), help='seg: ADE20K layout; det: COCO')
    parser.add_argument('--root', help="dataset root (default: the demo config's data_root)")
    parser.add_argument('--num-train', type=int, help='training images')
    parser.add_argument('--num-val', type=int, help='validation images')
    parser.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'), help='image size')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    generate, root, num_train, num_val, size = DEMO_DATA[args.task]
    def given(value, default):
        return default if value is None else value
    try:
        result = generate(given(args.root, root), num_train=given(args.num_train, num_train),
                          num_val=given(args.num_val, num_val),
                          image_size=tuple(given(args.size, size)), seed=args.seed)
    except ValueError as error:  # the generator names the bad value
        parser.error(str(error))
    print(f"{result['num_train']} training and {result['num_val']} validation images in "
          f"{result['root']} (classes: {', '.join(result['classes'])})")


if __name__ == '__main__':
    main()
