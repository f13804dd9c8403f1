"""Where attention is quadratic: mmseg's ViT-S and ViT-B (12 layers, patch 16, the class token)
stock, with PyTorch's fused softmax attention, and with NaLa in every layer, inference at 512 to
4096 square (1,025 to 65,537 tokens) and the training step at 512 and 1024; and NaLa's SETR
(ViT-L, 19 Cityscapes classes) at 4096.

Models per width:

* ``stock``: mmseg's ``VisionTransformer``; mmcv's ``MultiheadAttention`` asks torch for the
  attention weights, so every layer materialises the N x N logits and their softmax;
* ``sdpa``: the same model and weights, its attention called without returning the weights, so
  torch runs the fused ``scaled_dot_product_attention`` (nothing N x N is stored; still
  quadratic in time): the strongest softmax baseline, not the stock model;
* ``nala``: ``NaLaVisionTransformer`` with NaLa in all 12 layers (configs/swap/).

Each case's peak memory is taken in a fresh process of its own; the models of one width are
then timed in turns in one process (time ratios: medians of per-round ratios). Before a case
runs its memory and time are predicted from the smaller sizes (a power law in the tokens fitted
to the last two measured sizes, its exponent held to [1, 2], and for ``stock`` never below the
N x N tensors it keeps); a case predicted past this machine's memory or past ``--cap`` seconds
is skipped and its prediction recorded instead, so the out-of-memory killer is never reached
(each child also runs under an address-space limit). Results: benchmarks/results/speed/vit.{json,md,
png}; the Cityscapes whole-image vs sliding-window inference is benchmarks/speed/vit_cityscapes.py.

    python -m benchmarks.speed.vit                                   # everything
    python -m benchmarks.speed.vit --widths s --sizes 512 1024 --train-sizes --out /tmp/vit
    python -m benchmarks.speed.vit --report-only
"""
import argparse
import math
import os
import os.path as osp
from typing import List, Optional

import torch
from torch import nn

from nala_mm.analysis.measure import (
    Step,
    available_mib,
    device_name,
)

from ..lib import report
from ..lib.grid import grid_cli, per_round_ratio, run_grid
from ..lib.provenance import code_version
from ..lib.sweep import MODE_TITLES, backbone_step

WIDTHS = {'s': dict(embed_dims=384, num_heads=6), 'b': dict(embed_dims=768, num_heads=12)}
ENGINES = {'stock': 'stock (explicit attention weights)',
           'sdpa': 'stock with fused SDPA (memory-light, quadratic)',
           'nala': 'NaLa in all layers'}
LAYERS, PATCH, IMG_SIZE = 12, 16, 512
GIB = 2 ** 30
# memory left for the rest of the machine, and what a process holds beyond its peak step
SAFETY_MIB, PROCESS_MIB = 2048, 3072
PAPER_REDUCTION = 92.3  # % less peak memory than softmax attention at 70K+ tokens (the paper)


def model_name(width: str, engine: str) -> str:
    return f'vit_{width}_{engine}'


def tokens(side: int) -> int:
    return (math.ceil(side / PATCH)) ** 2 + 1  # the patches and the class token


class FusedSoftmaxAttention(nn.Module):
    """torch's ``nn.MultiheadAttention`` called without returning its weights: torch then runs
    ``scaled_dot_product_attention``, the same function of the same weights."""

    def __init__(self, attention: nn.MultiheadAttention):
        super().__init__()
        self.attention = attention

    def forward(self, *args, **kwargs):
        return self.attention(*args, **dict(kwargs, need_weights=False))


def build(width: str, engine: str, mode: str = 'fast') -> nn.Module:
    """ViT-``width`` with ``engine``'s attention; the NaLa ViT's ops take ``mode``."""
    from mmseg.models.backbones import VisionTransformer

    import nala_mm  # noqa: F401  (registers the swapped backbones)
    from nala_mm.models.swap import NaLaVisionTransformer
    kwargs = dict(img_size=IMG_SIZE, patch_size=PATCH, num_layers=LAYERS, mlp_ratio=4,
                  out_indices=(2, 5, 8, 11), with_cls_token=True, drop_path_rate=0.1,
                  norm_cfg=dict(type='LN', eps=1e-6), interpolate_mode='bicubic',
                  **WIDTHS[width])
    if engine == 'nala':
        model = NaLaVisionTransformer(mixers=('nala',) * LAYERS, mode=mode, **kwargs)
    else:
        model = VisionTransformer(**kwargs)
        if engine == 'sdpa':
            for layer in model.layers:
                layer.attn.attn = FusedSoftmaxAttention(layer.attn.attn)
    model.init_weights()
    return model


def make_step(name: str, side: int, mode: str, device: str) -> Step:
    _, width, engine = name.split('_')
    model = build(width, engine).to(device)
    return backbone_step(model, torch.randn(1, 3, side, side, device=device), mode)


# ------------------------------------------------------------------------------ prediction
def quadratic_floor_mib(name: str, side: int, mode: str) -> float:
    """What the stock model's attention keeps N x N (float32): without gradients the logits,
    their softmax and the head-averaged weights torch returns, of one layer at a time; for the
    backward every layer's softmax as well."""
    _, width, engine = name.split('_')
    if engine != 'stock':
        return 0.0
    heads, square = WIDTHS[width]['num_heads'], tokens(side) ** 2 * 4
    alive = 2 * heads + 1 if mode == 'fwd' else LAYERS * heads + heads + 1
    return alive * square / 2 ** 20


def extrapolate(points: List[tuple], side: int) -> Optional[float]:
    """A power law in the tokens through the last two (side, value) points, exponent in
    [1, 2]; one point: linear."""
    points = [(s, v) for s, v in points if v]
    if not points:
        return None
    (s1, v1), (s2, v2) = (points[-1], points[-1]) if len(points) == 1 else points[-2:]
    slope = 1.0 if s1 == s2 else math.log(v2 / v1) / math.log(tokens(s2) / tokens(s1))
    slope = min(max(slope, 1.0), 2.0)
    return v2 * (tokens(side) / tokens(s2)) ** slope


def predict(rows: List[dict], name: str, mode: str, side: int) -> dict:
    mine = sorted((r['side'], r) for r in rows if r['model'] == name and r['mode'] == mode
                  and r['side'] < side)
    memory = extrapolate([(s, r.get('mib')) for s, r in mine], side)
    floor = quadratic_floor_mib(name, side, mode)
    time = extrapolate([(s, r.get('ms')) for s, r in mine], side)
    return dict(mib=None if memory is None and not floor else max(memory or 0.0, floor),
                ms=time)


# ------------------------------------------------------------------------------ the grid
def step_of(name: str, case: dict) -> Step:
    """The grid's child: one call of model ``name`` in ``case``."""
    return make_step(name, case['side'], case['mode'], case['device'])


def describe(name: str, settings: dict) -> dict:
    return dict(engine=name.split('_')[2], tokens=tokens(settings['side']),
                pixels=settings['side'] ** 2, batch=1)


def predictor(budget_mib: float, cap_s: float, calls: int):
    """Skip a case predicted past the free memory or the cap; one call where rounds would pass
    the cap."""
    def predict_row(rows: List[dict], name: str, settings: dict) -> dict:
        guess = predict(rows, name, settings['mode'], settings['side'])
        row = dict(predicted_mib=guess['mib'], predicted_ms=guess['ms'])
        if guess['mib'] is not None and guess['mib'] > budget_mib:
            row['skipped'] = (f'predicted {guess["mib"] / 1024:.1f} GiB of peak memory, '
                              f'over the {budget_mib / 1024:.1f} GiB this machine has free')
        elif guess['ms'] is not None and guess['ms'] / 1e3 > cap_s:
            row['skipped'] = (f'predicted {guess["ms"] / 6e4:.1f} min a call, over the '
                              f'{cap_s / 60:.0f}-minute cap per case')
        else:
            row['calls'] = 1 if guess['ms'] and guess['ms'] * calls / 1e3 > cap_s else calls
        return row
    return predict_row


def sweep(args) -> List[dict]:
    budget = available_mib(args.device) - SAFETY_MIB
    cases = [(dict(mode=mode, side=side, width=width),
              [model_name(width, engine) for engine in ENGINES])
             for mode, sides in (('fwd', args.sizes), ('train', args.train_sizes))
             for side in sides for width in args.widths]
    return run_grid(__spec__.name, cases, repeats=args.repeats, warmup=args.warmup,
                    device=args.device, predict=predictor(budget, args.cap,
                                                          args.warmup + args.repeats),
                    timeout=4 * args.cap, limit_mib=budget + PROCESS_MIB, describe=describe,
                    # an interrupted run keeps what it measured
                    after_case=lambda rows: write_outputs(dict(rows=rows, **header(args)),
                                                          args.stem), desc='vit')


def header(args) -> dict:
    return dict(commit=args.commit, device=device_name(args.device), torch=torch.__version__,
                repeats=args.repeats,
                warmup=args.warmup, cap_s=args.cap, layers=LAYERS, patch=PATCH,
                img_size=IMG_SIZE, engines=ENGINES, paper_reduction_percent=PAPER_REDUCTION)


def ratio(rows: List[dict], row: dict, engine: str, key: str) -> Optional[float]:
    """``row``'s value over the same width, mode and size's ``engine``: times as the median of
    per-round ratios (same rounds), memory as a plain ratio."""
    other = next((r for r in rows if r['width'] == row['width'] and r['mode'] == row['mode']
                  and r['side'] == row['side'] and r['engine'] == engine), None)
    if other is None or row is other:
        return None
    if key == 'ms':
        return per_round_ratio(row, other)
    return row['mib'] / other['mib'] if row.get('mib') and other.get('mib') else None


def summarise(saved: dict) -> dict:
    rows = saved['rows']
    for row in rows:
        for engine in ('stock', 'sdpa'):
            row[f'ms_vs_{engine}'] = ratio(rows, row, engine, 'ms')
            row[f'mib_vs_{engine}'] = ratio(rows, row, engine, 'mib')
    # the peak-memory reduction against stock at the largest size both ran, per width
    reductions = {}
    for width in sorted({r['width'] for r in rows}):
        both = [r for r in rows if r['width'] == width and r['engine'] == 'nala'
                and r['mode'] == 'fwd' and r.get('mib_vs_stock')]
        if both:
            largest = max(both, key=lambda r: r['side'])
            reductions[width] = dict(side=largest['side'], tokens=largest['tokens'],
                                     percent_less=100 * (1 - largest['mib_vs_stock']))
    saved['memory_reduction_vs_stock'] = reductions
    return saved


def summary_table(rows: List[dict]) -> List[str]:
    """Per width, mode and size: each model's time and peak memory side by side, and NaLa's
    ratios (the table docs/user_guides/vit.md copies)."""
    def cell(row):
        if not row or row.get('skipped') or not row.get('ms'):
            return 'skipped' if row and row.get('skipped') else '-'
        mib = row['mib']
        return f"{row['ms'] / 1e3:.1f} s, " + (f'{mib / 1024:.2f} GiB' if mib >= 1024
                                                else f'{mib:.0f} MiB')

    table = []
    for mode in ('fwd', 'train'):
        for width in WIDTHS:
            for side in sorted({r['side'] for r in rows if r['mode'] == mode}):
                by = {r['engine']: r for r in rows if r['mode'] == mode and r['width'] == width
                      and r['side'] == side}
                nala = by.get('nala')
                if nala is None:
                    continue
                table.append([width.upper(), 'forward' if mode == 'fwd' else 'training step',
                              f"{side}² ({nala['tokens']:,})"] +
                             [cell(by.get(e)) for e in ENGINES] +
                             [report.fmt(nala.get(k), 3) for k in ('ms_vs_stock', 'mib_vs_stock',
                                                            'ms_vs_sdpa')])
    return report.markdown_table(['ViT', 'mode', 'side (tokens)', 'stock', 'fused SDPA', 'NaLa',
                           'NaLa time / stock', 'NaLa memory / stock', 'NaLa time / SDPA'],
                          table)


def label(row: dict) -> str:
    return f"ViT-{row['width'].upper()}, {ENGINES[row['engine']]}"


def note(row: dict) -> str:
    """Why a case did not run, with both predictions; or how it ran."""
    if row.get('skipped'):
        if 'memory' in row['skipped'] and row.get('predicted_ms'):
            return f"skipped: {row['skipped']} (and {row['predicted_ms'] / 6e4:.1f} min a call)"
        if row.get('predicted_mib'):
            return f"skipped: {row['skipped']} (and {row['predicted_mib'] / 1024:.1f} GiB)"
        return f"skipped: {row['skipped']}"
    return row.get('error') or ('one call' if row.get('calls') == 1 else '')


def write_outputs(saved: dict, stem: str) -> None:
    """``stem.json`` (``saved``, summarised), the page ``stem.md`` and the plot ``stem.png``."""
    saved = summarise(saved)
    os.makedirs(osp.dirname(stem), exist_ok=True)
    report.write_json(stem + '.json', saved)
    lines = [f"# ViT backbones: stock, fused SDPA and NaLa ({saved['device']})", '',
             f"torch {saved['torch']}; mmseg's VisionTransformer, {saved['layers']} layers, patch "
             f"{saved['patch']}, the class token; batch 1. Time: the models of one width, mode "
             f"and size in turns in one process ({saved['repeats']} rounds after "
             f"{saved['warmup']} warm-up; one call where that would pass the "
             f"{saved['cap_s'] / 60:.0f}-minute cap), ratios the median of per-round ratios. "
             'Memory: the peak of one step above the baseline, each model in its own process. '
             'Skipped: predicted past the free memory or the cap (the prediction is shown).', '',
             '## Summary (time and peak memory per model)', '']
    lines += summary_table(saved['rows']) + ['']
    for mode in ('fwd', 'train'):
        mine = [r for r in saved['rows'] if r['mode'] == mode]
        if not mine:
            continue
        lines += [f'## {MODE_TITLES[mode]}', '']
        lines += report.markdown_table(
            ['model', 'side', 'tokens', 'median ms', 'peak MiB', 'time / stock',
             'memory / stock', 'time / SDPA', 'memory / SDPA', 'note'],
            [[label(r), r['side'], r['tokens'], report.fmt(r.get('ms')), report.fmt(r.get('mib')),
              report.fmt(r.get('ms_vs_stock'), 3), report.fmt(r.get('mib_vs_stock'), 3),
              report.fmt(r.get('ms_vs_sdpa'), 3), report.fmt(r.get('mib_vs_sdpa'), 3), note(r)]
             for r in mine])
        lines.append('')
    reductions = saved['memory_reduction_vs_stock']
    if reductions:
        lines += ['## Peak memory against the stock ViT', '']
        lines += [f"- ViT-{w.upper()}: {r['percent_less']:.1f} % less at {r['side']}² "
                  f"({r['tokens']} tokens), the largest size where both ran (the paper: "
                  f"{saved['paper_reduction_percent']} % at 70K+ tokens)"
                  for w, r in reductions.items()]
    report.write_markdown(stem + '.md', lines)
    plot(saved, stem + '.png')


def plot(saved: dict, path: str) -> None:
    plt = report.pyplot()
    rows = [r for r in saved['rows'] if r['mode'] == 'fwd']
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.6))
    for width in sorted({r['width'] for r in rows}):
        for engine, style in zip(ENGINES, ('o-', 's--', '^-')):
            mine = [r for r in rows if r['width'] == width and r['engine'] == engine]
            for ax, key in ((ax_time, 'ms'), (ax_mem, 'mib')):
                measured = [(r['tokens'], r[key]) for r in mine if r.get(key)]
                if measured:
                    line, = ax.plot(*zip(*measured), style, label=label(mine[0]))
                    guessed = [(r['tokens'], r[f'predicted_{key}']) for r in mine
                               if r.get('skipped') and r.get(f'predicted_{key}')]
                    if guessed:  # skipped cases: their predictions, hollow
                        ax.plot(*zip(*guessed), style[0], mfc='none', color=line.get_color())
    report.log_log_axes(ax_time, 'inference: time (ms); hollow: predicted, skipped', 'tokens')
    report.log_log_axes(ax_mem, 'inference: peak memory (MiB); hollow: predicted, skipped',
                        'tokens')
    ax_time.legend(fontsize=7)
    report.save_figure(fig, path)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--widths', nargs='+', choices=list(WIDTHS), default=list(WIDTHS))
    parser.add_argument('--sizes', nargs='*', type=int, default=[512, 1024, 2048, 4096])
    parser.add_argument('--train-sizes', nargs='*', type=int, default=[512, 1024])
    parser.add_argument('--repeats', type=int, default=2, help='timed rounds in turns')
    parser.add_argument('--warmup', type=int, default=1, help='untimed rounds before timing')
    parser.add_argument('--cap', type=int, default=600, help='seconds a case may take')


def main() -> None:
    parsed = grid_cli(__doc__, 'vit', step_of, write_outputs, arguments)
    if parsed is None:
        return
    args, args.stem = parsed
    args.commit = code_version()  # taken at the start: a commit landing meanwhile is not it
    sweep(args)
    print(open(args.stem + '.md').read())


if __name__ == '__main__':
    main()
