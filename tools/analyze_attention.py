"""Inspect every attention layer of a trained backbone on one image (the paper's Figure 1).

    python tools/analyze_attention.py CONFIG CHECKPOINT IMAGE --out-dir DIR \\
        [--points X,Y ...] [--scale H W] [--device cpu]

The image is read (BGR), optionally resized to ``--scale`` (default: its own size, the longer
side capped at 1024), put through the model's ``data_preprocessor`` (normalisation, BGR->RGB,
padding, as the config says) and through the backbone once; a forward hook on every
:class:`GatedAttention` keeps the layer's input, from which ``layer.project`` gives q, k and the
RoPE table. Per layer (``DIR/<layer>.png``, one entry of ``DIR/attention_stats.json``):

* **Entropy vs query norm.** For every query token and head: the Shannon entropy (nats) of its
  attention row and ``||q||`` of that head's query vector, pooled over heads and tokens; a
  scatter plot and their Spearman rank correlation (``spearman_per_head`` too: heads whose
  norms differ can dominate the pooled value). Which rows: for the kernelised mixers (NaLa,
  plain linear attention) the rows *without* RoPE, which are distributions (non-negative, sum 1;
  with RoPE they can go negative and have no entropy); for softmax attention the rows *with*
  RoPE (still distributions). The JSON says which (``entropy_rows``). Rows are computed
  256 queries at a time, so no N x N matrix exists; above 8192 tokens the entropies come from a
  fixed (seeded) sample of 4096 queries (``entropy_queries_sampled``). ``qnorm_mean``,
  ``qnorm_p5`` and ``qnorm_p95`` cover every (head, query).
* **Attention maps** of the chosen query points (``--points X,Y`` in image pixels; default the
  centre): the row *with* RoPE (the weights that mix the values), averaged over heads, on the
  layer's token grid, blown up to the image as fed (after ``--scale``; each token covers its
  block of pixels) and overlaid. Kernelised rows with RoPE may be signed (shown on a diverging
  colour map). Only the chosen rows are computed.
* **NaLa layers**: the histogram of query norms and the share of (head, query) pairs whose
  exponent ``p = lam (tau + tanh ||q||)`` is within 1 % of its ceiling ``lam (tau + 1)``
  (``saturated_share``); ``null`` with ``norm_aware: false``, where the exponent is fixed.

``DIR/summary.png`` plots the Spearman correlation per layer; a table is printed at the end.
"""
import argparse
import json
import math
import os
import os.path as osp
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use('Agg')  # files only: no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import mmcv  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from mmengine.runner import load_checkpoint  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from tqdm import tqdm  # noqa: E402

from nala_mm.analysis import build_model_from_config, resolve_config_path  # noqa: E402
from nala_mm.models.attention import (GatedAttention, NormAwareLinearAttention,  # noqa: E402
                                      _KernelizedMixer)

Rope = Optional[Tuple[Tensor, Tensor]]
Point = Tuple[float, float]  # (x, y) in pixels
Size = Tuple[int, int]  # (height, width)

ROW_CHUNK = 256  # query rows per attention_weights call: ROW_CHUNK x N weights at a time
MAX_FULL_TOKENS = 8192  # above this, entropies come from a sample of queries
SAMPLED_QUERIES = 4096
SAMPLE_SEED = 0
MAX_SIDE = 1024  # default cap on the longer image side
SATURATION = 0.99  # "saturated": exponent >= 99 % of its ceiling
# Kernelised rows without RoPE and softmax rows are non-negative up to rounding; anything more
# negative means the rows are not distributions (e.g. RoPE was applied to a kernelised row).
NEGATIVE_TOLERANCE = 1e-6


# ------------------------------------------------------------------------------ statistics
def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of a 1-D array; tied values share the mean of the ranks they span."""
    _, group, counts = np.unique(np.asarray(values, dtype=np.float64).ravel(),
                                 return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # group g spans ranks ends[g]-counts[g]+1 .. ends[g]
    return (ends - (counts - 1) / 2.0)[group.ravel()]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (Pearson's on average ranks); NaN if either side is constant."""
    x, y = np.asarray(x).ravel(), np.asarray(y).ravel()
    if x.shape != y.shape:
        raise ValueError(f'spearman needs two samples of one length, got {x.size} and {y.size}')
    rank_x = average_ranks(x) - (x.size + 1) / 2.0  # mean rank is (n + 1) / 2, ties or not
    rank_y = average_ranks(y) - (y.size + 1) / 2.0
    scale = math.sqrt(float(rank_x @ rank_x) * float(rank_y @ rank_y))
    if scale == 0.0:
        return float('nan')
    return float(np.clip(rank_x @ rank_y / scale, -1.0, 1.0))


def row_entropy(weights: Tensor) -> Tensor:
    """Shannon entropy (nats) of each row (last dim) of non-negative attention weights.

    Negative rounding is clamped to 0 and rows are renormalised (NaLa's ``eps`` leaves their sums
    a hair under 1); a row that is not a distribution is refused.
    """
    lowest = weights.min().item()
    if lowest < -NEGATIVE_TOLERANCE:
        raise ValueError(f'attention rows have weights down to {lowest:.3g}; entropy needs '
                         f'non-negative rows (kernelised rows must be taken without RoPE)')
    probs = weights.clamp_min(0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return -torch.xlogy(probs, probs).sum(dim=-1)


def entropy_rope(layer: GatedAttention, rope: Rope) -> Tuple[Rope, str]:
    """The RoPE table to take entropy rows with, and its label for the JSON (module doc)."""
    if isinstance(layer, _KernelizedMixer) or rope is None:
        return None, 'without RoPE'
    return rope, 'with RoPE'


def query_entropies(layer: GatedAttention, q: Tensor, k: Tensor, rope: Rope,
                    rows: Optional[Tensor] = None, chunk: int = ROW_CHUNK) -> Tensor:
    """Entropies ``(B, heads, len(rows))`` of the attention rows of the queries ``rows`` (all
    when ``None``), ``chunk`` rows at a time so that at most ``chunk x N`` weights exist."""
    if rows is None:
        rows = torch.arange(q.shape[-2], device=q.device)
    return torch.cat([row_entropy(layer.attention_weights(q, k, rope, rows[i:i + chunk]))
                      for i in range(0, len(rows), chunk)], dim=-1)


def exponent_ceiling(layer: NormAwareLinearAttention) -> float:
    """The supremum ``lam (tau + 1)`` of NaLa's query exponent."""
    return layer.cfg.lam * (layer.cfg.tau + 1.0)


def saturated_share(layer: NormAwareLinearAttention, qnorm: Tensor) -> Optional[float]:
    """Share of queries whose exponent ``lam (tau + tanh ||q||)`` is >= 99 % of its ceiling;
    ``None`` when the layer is not norm-aware (its exponent is fixed)."""
    cfg = layer.cfg
    if not cfg.norm_aware:
        return None
    power = cfg.lam * (cfg.tau + torch.tanh(qnorm))
    return float((power >= SATURATION * exponent_ceiling(layer)).double().mean())


def saturation_norm(layer: NormAwareLinearAttention) -> float:
    """The query norm from which the exponent is >= 99 % of its ceiling:
    ``tanh ||q|| >= 0.99 (tau + 1) - tau``."""
    bound = SATURATION * (layer.cfg.tau + 1.0) - layer.cfg.tau
    return math.atanh(max(bound, 0.0))  # bound < 0 (tau > 99): every query is saturated


def query_token(point: Point, input_size: Size, grid: Size) -> Tuple[int, int]:
    """Pixel ``(x, y)`` of the network input -> ``(row, col)`` on a layer's ``h x w`` grid."""
    (x, y), (height, width), (rows, cols) = point, input_size, grid
    return min(math.floor(y * rows / height), rows - 1), min(math.floor(x * cols / width), cols - 1)


def _json_number(value: float) -> Optional[float]:
    """NaN (no correlation defined) -> ``None``: JSON has no NaN."""
    return None if math.isnan(value) else value


@dataclass
class LayerStats:
    """What :func:`layer_statistics` measured on one layer (arrays are for the plots)."""
    mixer: str
    heads: int
    grid: Size
    entropy: np.ndarray  # per (head, entropy query), pooled
    entropy_qnorm: np.ndarray  # ||q|| of the same (head, query) pairs
    qnorm: np.ndarray  # ||q|| of every (head, query)
    entropy_rows: str
    entropy_sampled: bool
    query_tokens: List[Tuple[int, int]] = field(default_factory=list)
    maps: List[np.ndarray] = field(default_factory=list)  # (h, w) per point, mean over heads
    norm_aware: Optional[bool] = None  # NaLa layers only, from here down
    saturated_share: Optional[float] = None
    exponent: Optional[float] = None  # ceiling when norm-aware, else the fixed exponent
    saturation_norm: Optional[float] = None  # ||q|| from which the exponent counts as saturated

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def spearman(self) -> float:
        return spearman(self.entropy, self.entropy_qnorm)

    def summary(self, name: str, stage: Optional[int]) -> dict:
        """This layer's entry of ``attention_stats.json``."""
        entry = dict(layer=name, mixer=self.mixer, stage=stage, tokens=self.tokens,
                     grid=list(self.grid), heads=self.heads,
                     spearman_entropy_vs_qnorm=_json_number(self.spearman),
                     # pooling mixes heads whose norms differ: each head's own correlation
                     spearman_per_head=[_json_number(spearman(e, n)) for e, n in zip(
                         self.entropy.reshape(self.heads, -1),
                         self.entropy_qnorm.reshape(self.heads, -1))],
                     entropy_rows=self.entropy_rows,
                     entropy_queries=self.entropy.size // self.heads,
                     entropy_queries_sampled=self.entropy_sampled,
                     entropy_mean=float(self.entropy.mean()),
                     qnorm_mean=float(self.qnorm.mean()),
                     qnorm_p5=float(np.percentile(self.qnorm, 5)),
                     qnorm_p95=float(np.percentile(self.qnorm, 95)),
                     query_tokens=[list(t) for t in self.query_tokens])
        if self.norm_aware is not None:
            entry.update(norm_aware=self.norm_aware, saturated_share=self.saturated_share)
            entry['exponent_ceiling' if self.norm_aware else 'fixed_exponent'] = self.exponent
        return entry


def layer_statistics(layer: GatedAttention, x: Tensor, points: Sequence[Point] = (),
                     input_size: Optional[Size] = None, chunk: int = ROW_CHUNK) -> LayerStats:
    """Entropy / query-norm statistics and the attention maps of ``points`` for one layer.

    ``x`` is the layer's input, channels-last tokens ``(1, h, w, C)``; ``points`` are pixels ``(x, y)`` of the network
    input of size ``input_size`` (needed only with points).
    """
    if x.dim() != 4 or x.shape[0] != 1:
        raise ValueError(f'expected one layer input (1, h, w, C), got {tuple(x.shape)}')
    if points and input_size is None:
        raise ValueError('input_size (H, W) is needed to place query points on the token grid')
    grid = (x.shape[1], x.shape[2])
    tokens = grid[0] * grid[1]
    with torch.no_grad():
        q, k, _, _, rope = layer.project(x.float())
        qnorm = torch.linalg.vector_norm(q[0], dim=-1)  # (heads, N)
        rows = None
        if tokens > MAX_FULL_TOKENS:
            generator = torch.Generator().manual_seed(SAMPLE_SEED)
            rows = torch.randperm(tokens, generator=generator)[:SAMPLED_QUERIES].sort().values
            rows = rows.to(q.device)
        rope_for_entropy, label = entropy_rope(layer, rope)
        entropy = query_entropies(layer, q, k, rope_for_entropy, rows, chunk)[0]
        stats = LayerStats(
            mixer=type(layer).__name__, heads=layer.num_heads, grid=grid,
            entropy=entropy.flatten().cpu().numpy(),
            entropy_qnorm=(qnorm if rows is None else qnorm[:, rows]).flatten().cpu().numpy(),
            qnorm=qnorm.flatten().cpu().numpy(), entropy_rows=label,
            entropy_sampled=rows is not None)
        for point in points:
            row, col = query_token(point, input_size, grid)
            index = torch.tensor([row * grid[1] + col], device=q.device)
            weights = layer.attention_weights(q, k, rope, index)[0, :, 0]  # (heads, N), RoPE on
            stats.query_tokens.append((row, col))
            stats.maps.append(weights.mean(dim=0).reshape(grid).cpu().numpy())
        if isinstance(layer, NormAwareLinearAttention):
            stats.norm_aware = layer.cfg.norm_aware
            stats.saturated_share = saturated_share(layer, qnorm)
            if layer.cfg.norm_aware:
                stats.exponent, stats.saturation_norm = exponent_ceiling(layer), \
                    saturation_norm(layer)
            else:
                stats.exponent = layer.cfg.fixed_power
    return stats


# ------------------------------------------------------------------------------ the model side
def attention_layers(backbone: nn.Module) -> Dict[str, GatedAttention]:
    """Every :class:`GatedAttention` of a backbone, by module name."""
    layers = {name: m for name, m in backbone.named_modules() if isinstance(m, GatedAttention)}
    if not layers:
        raise ValueError(f'backbone {type(backbone).__name__} has no GatedAttention layer to '
                         f'analyse (expected a NaLaFormer)')
    return layers


def stage_of(name: str) -> Optional[int]:
    """``'layers.2.blocks.1.attn'`` -> 2 (NaLaFormer's stage list); ``None`` elsewhere."""
    match = re.search(r'(?:^|\.)layers\.(\d+)\.', name)
    return int(match.group(1)) if match else None


def capture_inputs(backbone: nn.Module, layers: Dict[str, GatedAttention],
                   inputs: Tensor) -> Dict[str, Tensor]:
    """One backbone forward; the input of every layer in ``layers``, by name."""
    captured: Dict[str, Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            captured[name] = args[0].detach()
        return hook

    handles = [layer.register_forward_hook(keep(name)) for name, layer in layers.items()]
    try:
        with torch.no_grad():
            backbone(inputs)
    finally:
        for handle in handles:
            handle.remove()
    missing = sorted(set(layers) - set(captured))
    if missing:
        raise RuntimeError(f'attention layers not called by the backbone forward: {missing}')
    return captured


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


def preprocess(model: nn.Module, image_bgr: np.ndarray) -> Tensor:
    """The backbone input of one BGR image, through the config's data preprocessor."""
    tensor = torch.from_numpy(np.ascontiguousarray(image_bgr)).permute(2, 0, 1).contiguous()
    return model.data_preprocessor(dict(inputs=[tensor], data_samples=None), False)['inputs']


# ------------------------------------------------------------------------------ figures
def token_map_on_image(token_map: np.ndarray, input_size: Size, image_size: Size) -> np.ndarray:
    """A ``(h, w)`` map over the padded network input -> ``image_size`` pixels: each token covers
    its block (nearest, the same floor mapping as :func:`query_token`), padding cropped."""
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
    layers = attention_layers(model.backbone)
    captured = capture_inputs(model.backbone, layers, inputs)

    os.makedirs(args.out_dir, exist_ok=True)
    image_rgb = fed[..., ::-1]
    entries = []
    for name, layer in tqdm(layers.items(), desc='attention layers', unit='layer'):
        stats = layer_statistics(layer, captured.pop(name), fed_points, input_size)
        entry = stats.summary(name, stage_of(name))
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
