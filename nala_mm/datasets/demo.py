"""The demos' generated data, from the command line, where the demo configs read it.

    python -m nala_mm.datasets.demo seg    # data/demo/ade/ADEChallengeData2016 (ADE20K layout)
    python -m nala_mm.datasets.demo det    # data/demo/coco (COCO layout)
    python -m nala_mm.datasets.demo cls    # data/demo/imagenet (ImageNet folder layout)
    python -m nala_mm.datasets.demo seg --num-train 8 --num-val 2 --size 96 96   # a quick set

Paths are relative to the working directory, as the configs' ``data_root``: run it where you
train (``mim train nala_mm ade20k_demo_nala_upernet.py`` then finds the data). The full sets are
what ``make demo`` / ``make demo-det`` train on; generation is deterministic and skipped when the
same set is already there.
"""
import argparse
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .synthetic_ade import generate_ade_like
from .synthetic_coco import generate_coco_like
from .synthetic_imagenet import generate_imagenet_like


@dataclass(frozen=True)
class DemoTask:
    """One demo: its data generator (whose defaults are the set ``make demo`` / ``make demo-det``
    train on), where its config reads the data, and its config and work dir (tools/demo.py)."""
    generate: Callable[..., dict]
    data_root: str
    config: str
    work_dir: str


DEMO_TASKS = {
    'seg': DemoTask(generate_ade_like, 'data/demo/ade/ADEChallengeData2016',
                    'configs/demo/ade20k_demo_nala_upernet.py', 'work_dirs/demo_seg'),
    'det': DemoTask(generate_coco_like, 'data/demo/coco',
                    'configs/demo/coco_demo_nala_mask-rcnn.py', 'work_dirs/demo_det'),
    'cls': DemoTask(generate_imagenet_like, 'data/demo/imagenet',
                    'configs/demo/imagenet_demo_nala_cls.py', 'work_dirs/demo_cls'),
}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m nala_mm.datasets.demo',
        description="Generate the demos' data (ADE20K, COCO or ImageNet layout) where their "
                    'configs read it')
    parser.add_argument('task', choices=sorted(DEMO_TASKS),
                        help='seg: ADE20K layout; det: COCO; cls: ImageNet')
    parser.add_argument('--root', help="dataset root (default: the demo config's data_root)")
    parser.add_argument('--num-train', type=int, help='training images (cls: per class)')
    parser.add_argument('--num-val', type=int, help='validation images (cls: per class)')
    parser.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'), help='image size')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    task = DEMO_TASKS[args.task]
    given = dict(num_train=args.num_train, num_val=args.num_val,
                 image_size=None if args.size is None else tuple(args.size))
    try:
        result = task.generate(args.root or task.data_root, seed=args.seed,
                               **{k: v for k, v in given.items() if v is not None})
    except ValueError as error:  # the generator names the bad value
        parser.error(str(error))
    print(f"{result['num_train']} training and {result['num_val']} validation images in "
          f"{result['root']} (classes: {', '.join(result['classes'])})")


if __name__ == '__main__':
    main()
