"""Inspect every attention layer of a trained backbone on one image (the paper's Figure 1).

    python tools/analyze_attention.py CONFIG CHECKPOINT IMAGE --out-dir DIR \\
        [--points X,Y ...] [--scale H W] [--device cpu]

The image is read (BGR), optionally resized to ``--scale`` (default: its own size, the longer
side capped at 1024), put through the model's ``data_preprocessor`` and through the backbone
once; the statistics of every attention layer come from :mod:`nala_mm.analysis.attention_stats`
(what they are and which attention rows they use: see there). Written to ``DIR``:

* ``<layer>.png``: entropy vs query norm (scatter, Spearman in the title), for NaLa layers the
  histogram of query norms with the exponent's saturation, and the attention map of each query
  point (``--points X,Y`` in image pixels; default the centre): the row with RoPE, averaged over
  heads, each token blown up to its block of pixels and overlaid on the image as fed (signed
  rows on a diverging colour map);
* ``attention_stats.json``: one entry per layer (:meth:`LayerStats.summary`) and the inputs;
* ``summary.png``: the Spearman correlation per layer. A table is printed at the end.
"""
import argparse
import json
import math
import os
import os.path as osp
from typing import List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use('Agg')  # files only: no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import mmcv  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from mmengine.runner import load_checkpoint  # noqa: E402
from tqdm import tqdm  # noqa: E402

from nala_mm import compat  # noqa: E402
from nala_mm.analysis import LayerStats, analyze_backbone, preprocess  # noqa: E402
from nala_mm.analysis.attention_stats import Point, Size  # noqa: E402
from nala_mm.apis.config_loading import build_model_from_config, resolve_config_path  # noqa: E402

MAX_SIDE = 1024  # default cap on the longer image side


# ------------------------------------------------------------------------------ the image
def load_image(path: str, scale: Optional[Size]) -> Tuple[np.ndarray, np.ndarray]:
    """The image as read (BGR) and as fed to the model (resized to ``scale``, or the longer side
    capped at ``MAX_SIDE``)."""
    image = mmcv.imread(path)
    if image is None:
        raise ValueError(f'could not read an image from {path}')
    height, width = image.shape[:2]
    if scale is None and max(height, width) > MAX_SIDE:
        ratio = MAX_SIDE / max(height, width)
        scale = (max(1, round(height * ratio)), max(1, round(width * ratio)))
        print(f'image {width}x{height} is larger than {MAX_SIDE} px on its longer side: analysed '
              f'at {scale[1]}x{scale[0]} (pass --scale H W to choose)')
    fed = image if scale is None else mmcv.imresize(image, (scale[1], scale[0]))
    return image, fed


# ------------------------------------------------------------------------------ figures
def token_map_on_image(token_map: np.ndarray, input_size: Size, image_size: Size) -> np.ndarray:
    """A ``(h, w)`` map over the padded network input -> ``image_size`` pixels: each token covers
    its block (nearest, the same floor mapping as
    :func:`nala_mm.analysis.query_token`), padding cropped."""
    blown_up = F.interpolate(torch.from_numpy(token_map)[None, None].float(), size=input_size,
                             mode='nearest')[0, 0]
    return blown_up[:image_size[0], :image_size[1]].numpy()


def plot_layer(path: str, name: str, stats: LayerStats, image_rgb: np.ndarray,
               points: Sequence[Point], input_size: Size,
               labels: Optional[Sequence[Point]] = None) -> None:
    """The layer's figure: scatter, query-norm histogram (NaLa) and one map per point.

    ``points`` are pixels of ``image_rgb`` (the image as fed); ``labels`` the same points as
    the user gave them (in the original image), for the titles.
    """
    nala = stats.norm_aware is not None
    panels = 1 + int(nala) + len(points)
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 4.2), squeeze=False)
    axes = list(axes[0])
    ax = axes.pop(0)
    ax.scatter(stats.entropy_qnorm, stats.entropy, s=3, alpha=0.3, linewidths=0, rasterized=True)
    ax.axhline(math.log(stats.tokens), color='grey', ls='--', lw=1, label='uniform row')
    ax.set(xlabel='query norm ||q|| (per head)', ylabel='row entropy (nats)',
           title=f'Spearman {stats.spearman:+.3f} (rows {stats.entropy_rows})')
    ax.legend(loc='best', fontsize=8)
    if nala:
        ax = axes.pop(0)
        ax.hist(stats.qnorm, bins=50, color='tab:orange')
        ax.set(xlabel='query norm ||q|| (per head)', ylabel='queries')
        if stats.norm_aware:
            ax.axvline(stats.saturation_norm, color='black', ls='--', lw=1,
                       label=f'saturated above {stats.saturation_norm:.2f}')
            ax.legend(loc='best', fontsize=8)
            ax.set_title(f'exponent >= 99% of ceiling {stats.exponent:g}: '
                         f'{100 * stats.saturated_share:.1f}% of queries')
        else:
            ax.set_title(f'exponent fixed at {stats.exponent:g} (norm_aware=False)')
    for ax, point, label, token, token_map in zip(axes, points, labels or points,
                                                  stats.query_tokens, stats.maps):
        ax.imshow(image_rgb)
        # NaLa's and linear attention's rows with RoPE can be signed: a diverging map centred
        # on 0 then, so that sign is visible; distributions get a sequential one.
        if token_map.min() < 0:
            limit = float(np.abs(token_map).max())
            colours = dict(cmap='RdBu_r', vmin=-limit, vmax=limit)
        else:
            colours = dict(cmap='jet', vmin=0.0)
        heat = ax.imshow(token_map_on_image(token_map, input_size, image_rgb.shape[:2]),
                         alpha=0.5, **colours)
        # a white cross on a black one: visible on any image and colour map
        ax.plot(*point, marker='x', color='black', markersize=12, mew=4)
        ax.plot(*point, marker='x', color='white', markersize=10, mew=2)
        ax.set_title(f'query ({label[0]:.0f}, {label[1]:.0f}) -> token {token}\n'
                     f'row with RoPE, mean over heads', fontsize=10)
        ax.axis('off')
        fig.colorbar(heat, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f'{name} ({stats.mixer}, {stats.heads} heads, {stats.grid[0]}x{stats.grid[1]} '
                 f'tokens)')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_summary(path: str, entries: List[dict]) -> None:
    """Spearman(entropy, ||q||) per layer, one bar per layer coloured by mixer."""
    mixers = sorted({e['mixer'] for e in entries})
    colours = {m: f'C{i}' for i, m in enumerate(mixers)}
    values = [e['spearman_entropy_vs_qnorm'] for e in entries]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(entries) + 2), 4.2))
    ax.bar(range(len(entries)), [0.0 if v is None else v for v in values],
           color=[colours[e['mixer']] for e in entries])
    ax.axhline(0.0, color='black', lw=0.8)
    ax.set_xticks(range(len(entries)), [e['layer'] for e in entries], rotation=45, ha='right',
                  fontsize=8)
    ax.set(ylim=(-1.05, 1.05), ylabel='Spearman(row entropy, ||q||)',
           title='Row entropy vs query norm\n(negative: larger queries attend more sharply)')
    ax.legend(handles=[Patch(color=colours[m], label=m) for m in mixers], loc='best', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_table(entries: List[dict]) -> None:
    header = (f'{"layer":<28} {"mixer":<26} {"stage":>5} {"tokens":>7} {"heads":>5} '
              f'{"spearman":>9} {"|q| mean":>9} {"saturated":>9}')
    print(header)
    print('-' * len(header))
    for e in entries:
        rho = e['spearman_entropy_vs_qnorm']
        share = e.get('saturated_share')
        stage = '-' if e['stage'] is None else e['stage']
        print(f'{e["layer"]:<28} {e["mixer"]:<26} {stage:>5} {e["tokens"]:>7} {e["heads"]:>5} '
              f'{"nan" if rho is None else f"{rho:+.3f}":>9} {e["qnorm_mean"]:>9.3f} '
              f'{"-" if share is None else f"{100 * share:.1f}%":>9}')


# ------------------------------------------------------------------------------ command line
def parse_point(text: str) -> Point:
    """``'X,Y'`` -> ``(x, y)`` pixels."""
    try:
        x, y = (float(v) for v in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f'a point must be X,Y in pixels (e.g. 64,48), got '
                                         f'{text!r}') from None
    return x, y


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Entropy vs query norm, attention maps and NaLa exponent saturation of '
                    'every attention layer of a backbone, on one image')
    parser.add_argument('config', help='mmseg or mmdet config')
    parser.add_argument('checkpoint', help='trained model checkpoint')
    parser.add_argument('image')
    parser.add_argument('--out-dir', required=True, help='where figures and JSON are written')
    parser.add_argument('--points', nargs='+', type=parse_point, metavar='X,Y',
                        help='query pixels of the attention maps (default: the image centre)')
    parser.add_argument('--scale', nargs=2, type=int, metavar=('H', 'W'),
                        help=f'resize the image first (default: its own size, the longer side '
                             f'capped at {MAX_SIDE})')
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args(argv)
    if args.scale is not None and min(args.scale) < 1:
        parser.error(f'--scale H W must be positive, got {args.scale}')
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    compat.install()  # checkpoints saved by the project's runs load under weights-only unpickling
    for what, path in (('config', resolve_config_path(args.config)),
                       ('checkpoint', args.checkpoint), ('image', args.image)):
        if not osp.isfile(path):
            raise FileNotFoundError(f'{what} {path} does not exist')
    image, fed = load_image(args.image, args.scale)
    image_size, fed_size = image.shape[:2], fed.shape[:2]
    points = args.points or [(image_size[1] / 2.0, image_size[0] / 2.0)]
    for x, y in points:
        if not (0 <= x < image_size[1] and 0 <= y < image_size[0]):
            raise ValueError(f'query point ({x:g}, {y:g}) lies outside the image of '
                             f'{image_size[1]}x{image_size[0]} pixels (expected 0 <= X < '
                             f'{image_size[1]}, 0 <= Y < {image_size[0]})')
    # the query pixels on the image the network sees (resized, before padding)
    fed_points = [(x * fed_size[1] / image_size[1], y * fed_size[0] / image_size[0])
                  for x, y in points]

    model, _ = build_model_from_config(args.config)
    load_checkpoint(model, args.checkpoint, map_location='cpu')
    model.to(args.device)
    inputs = preprocess(model, fed)
    input_size = tuple(inputs.shape[-2:])  # padded, where the preprocessor pads
    layers = analyze_backbone(model.backbone, inputs, fed_points, input_size, progress=True)

    os.makedirs(args.out_dir, exist_ok=True)
    image_rgb = fed[..., ::-1]
    entries = []
    for name, stats in tqdm(layers.items(), desc='figures', unit='layer'):
        entry = stats.summary(name)
        entry['figure'] = f'{name}.png'
        plot_layer(osp.join(args.out_dir, entry['figure']), name, stats, image_rgb, fed_points,
                   input_size, labels=points)
        entries.append(entry)
    plot_summary(osp.join(args.out_dir, 'summary.png'), entries)
    result = dict(config=args.config, checkpoint=args.checkpoint, image=args.image,
                  image_size=list(image_size), input_size=list(input_size),
                  points=[list(p) for p in points], layers=entries)
    with open(osp.join(args.out_dir, 'attention_stats.json'), 'w') as f:
        json.dump(result, f, indent=2)
    print_table(entries)
    print(f'figures and attention_stats.json written to {args.out_dir}')


if __name__ == '__main__':
    main()
