"""Every measured number in README.md and docs/*.md matches the committed results file it quotes.

The README and the docs copy numbers from runs (``benchmarks/results/*.json`` and ``*.md``). These
checks fail when a results file is re-measured and a page is not updated, when a number is edited
by hand, when a page quotes a results file that is not committed (a failure, never a skip), and
when a page states a measurement that nothing here checks.

How a page is checked:

* ``QUOTES`` holds one builder per results file. It renders, from the file, the phrases and table
  rows the pages quote (``Quote``); each must appear verbatim in its page (whitespace and ``**``
  normalised; a table row is found by its first cell), and the page must name the file.
* Every other measurement-like number on a page (a decimal such as ``0.63``, ``1.9e-06``, or a
  number with a unit: ``×``, ``%``, ``ms``, ``MiB``, ``GiB``, ``s``, ``min``) must lie inside a
  checked quote, or be listed in ``NOT_MEASURED`` with the reason it needs no results file
  (numbers quoted from the paper, with their citation on the page; versions).
* Not measurements, hence not swept: code (fenced or indented blocks, inline code: settings and
  commands), link targets, package versions (``1.2.2``), sizes (``3×3``), a bound after ``<``,
  ``>``, ``≤`` or ``≥`` (test thresholds), and a bare power of ten such as ``1e-4`` (tolerances,
  settings).
"""
import json
import os
import os.path as osp
import re
from dataclasses import dataclass
from statistics import mean
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from tests.helpers import REPO

RESULTS = 'benchmarks/results'
PAGES = ('README.md', 'docs/method.md', 'docs/fidelity.md', 'docs/mixers.md', 'docs/speed.md',
         'docs/deploy.md', 'docs/robustness.md', 'docs/demos.md', 'docs/swap.md',
         'docs/getting_started.md', 'docs/vit.md', 'docs/linearize.md')

PAPER = 'NaLaFormer paper, arXiv:2506.21137 (cited on the page)'
ARXIV = {'2308.00442': "FLatten Transformer's arXiv id", '2312.08874': "Agent Attention's arXiv id",
         '2412.06590': "InLine attention's arXiv id", '2402.04347': "Hedgehog's arXiv id",
         '2410.10254': "LoLCATs' arXiv id"}
# Numbers a page may state without a results file, and why.
NOT_MEASURED: Dict[str, Dict[str, str]] = {
    'README.md': {'2506.21137': 'the paper\'s arXiv id', '2.2': 'an mmcv version',
                  '3.3': 'an mmdet version'},
    'docs/method.md': {
        '2506.21137': 'the paper\'s arXiv id',
        **{top1: f'ImageNet-1K top-1, {PAPER}' for top1 in ('79.1', '82.6', '84.3', '85.2',
                                                              '85.7')}},
    'docs/fidelity.md': {'2506.21137': 'the paper\'s arXiv id'},
    'docs/vit.md': {
        **ARXIV, '10': "SETR's stock 10x learning rate on its heads (a setting)"},
    'docs/linearize.md': {**ARXIV, '90': "the issue's goal for the zero-shot mIoU (a target)"},
    'docs/swap.md': {
        '2308.00442': 'FLatten Transformer\'s arXiv id',
        '2312.08874': 'Agent Attention\'s arXiv id',
        **{value: 'ADE20K mIoU / COCO AP of Swin-T, FLatten-Swin-T and Agent-Swin-T as their '
                  'papers report them (cited on the page)'
           for value in ('44.51', '44.82', '46.68', '43.7', '39.8', '44.2', '40.2', '44.6',
                         '40.7')}},
}


@dataclass(frozen=True)
class Quote:
    """``text`` must appear in a page; with ``row``, inside the table row whose first cell it is."""
    text: str
    row: Optional[str] = None


def row(*cells: str) -> Quote:
    """A whole table row, found by its first cell."""
    return Quote('| ' + ' | '.join(cells) + ' |', row=cells[0])


def cells(first: str, *rest: str) -> Quote:
    """Consecutive cells of the row whose first cell is ``first``."""
    return Quote('| ' + ' | '.join(rest) + ' |', row=first)


Quotes = Dict[str, List[Quote]]  # page -> what it must contain


# ------------------------------------------------------------------------------ results files
def results_path(name: str) -> str:
    return osp.join(REPO, RESULTS, name)


def load(name: str) -> dict:
    """A committed results file; missing is a failure: the docs quote it."""
    if not osp.exists(results_path(name)):
        pytest.fail(f'{RESULTS}/{name} is quoted by the README or docs but is not committed')
    with open(results_path(name)) as f:
        return json.load(f)


def markdown_rows(name: str) -> List[List[str]]:
    """Data rows (cells) of every table in a committed results ``.md`` file."""
    if not osp.exists(results_path(name)):
        pytest.fail(f'{RESULTS}/{name} is quoted by the README or docs but is not committed')
    with open(results_path(name)) as f:
        lines = [line.strip() for line in f]
    rows = []
    for i, line in enumerate(lines):
        is_header = i + 1 < len(lines) and lines[i + 1].startswith('|---')
        if line.startswith('|') and not line.startswith('|---') and not is_header:
            rows.append([c.strip() for c in line.strip('|').split('|')])
    return rows


def verbatim(name: str, keep: Callable[[List[str]], bool] = lambda r: True) -> List[Quote]:
    """The rows of a results ``.md`` table, quoted as they are."""
    return [row(*r) for r in markdown_rows(name) if keep(r)]


def f2(x: float) -> str:
    return f'{x:.2f}'


# ------------------------------------------------------------------------------ quote builders
def demo_seg() -> Quotes:
    summary = load('demo_seg.json')
    miou, aacc = summary['metrics']['mIoU'], summary['metrics']['aAcc']
    baseline = summary['majority_class_baseline_mIoU']
    classes = [row(name, f2(c['IoU']), f2(c['Acc'])) for name, c in summary['per_class'].items()]
    return {
        'docs/demos.md': classes + [
            cells('mIoU', f'{miou:.2f} (majority-class baseline {baseline:.2f})'),
            Quote(f"{summary['iterations']:,} iterations of batch 8, "
                  f"{summary['train_seconds'] / 60:.1f} min of training"),
            Quote(f'mIoU {miou:.2f} (aAcc {aacc:.2f}) against a majority-class baseline of '
                  f'{baseline:.2f}')],
        'docs/mixers.md': [Quote(f'the full demo reaches mIoU {miou:.2f}')],
        'README.md': [Quote(f"{summary['iterations']:,} iterations | mIoU {miou:.2f} "
                            f'(majority-class baseline {baseline:.2f}) |')],
    }


def demo_det() -> Quotes:
    summary = load('demo_det.json')
    m, per_class = summary['metrics'], summary['per_class']
    iters, seconds = summary['iterations'], summary['train_seconds']
    classes = [row(name, *(f'{v:.3f}' for v in (bbox['mAP'], bbox['mAP_50'],
                                                 per_class['segm'][name]['mAP'],
                                                 per_class['segm'][name]['mAP_50'])))
               for name, bbox in per_class['bbox'].items()]
    star = f"segm {per_class['segm']['star']['mAP']:.3f} against bbox " \
           f"{per_class['bbox']['star']['mAP']:.3f}"
    worst = min(per_class['segm'], key=lambda name: per_class['segm'][name]['mAP'])
    assert worst == 'star', 'the page says stars lose most in masks'
    return {
        'docs/demos.md': classes + [
            Quote(f'{iters} iterations'),
            Quote(f'{seconds / 60:.1f} min of training ({seconds / iters:.1f} s per iteration)'),
            Quote(f"bbox mAP {m['coco/bbox_mAP']:.3f} (AP50 {m['coco/bbox_mAP_50']:.3f}, AP75 "
                  f"{m['coco/bbox_mAP_75']:.3f}) and segm mAP {m['coco/segm_mAP']:.3f} (AP50 "
                  f"{m['coco/segm_mAP_50']:.3f}, AP75 {m['coco/segm_mAP_75']:.3f})"),
            Quote(f'Stars lose most in masks ({star})')],
        'README.md': [Quote(f"bbox mAP {m['coco/bbox_mAP']:.3f}, segm mAP "
                            f"{m['coco/segm_mAP']:.3f} |")],
    }


def out_norm_study() -> Quotes:
    saved = load('out_norm_study.json')
    return {'docs/demos.md': [
        row(run['label'], *(f'{run[k]:.3f}' for k in ('bbox_mAP', 'bbox_mAP_50', 'segm_mAP',
                                                       'segm_mAP_50')), f"{run['final_acc']:.1f}")
        for run in saved['runs']]}


def ablation() -> Quotes:
    saved = load('ablation.json')
    summary = saved['summary']
    for variant, s in summary.items():
        assert s['runs'] >= 3, f"{variant}: {s['runs']} runs, the comparison needs >= 3 seeds"
    # what docs/mixers.md concludes: every paired difference is within one std of zero but
    # softmax's, which is just outside and negative at every seed
    outside = {v: abs(s['paired_delta_mean']) / s['paired_delta_std'] for v, s in summary.items()
               if abs(s['paired_delta_mean']) > s['paired_delta_std']}
    assert set(outside) == {'softmax'} and outside['softmax'] < 1.05, outside
    # every run of the sweep is in the file, with its seed
    assert len(saved['runs']) == sum(s['runs'] for s in summary.values())
    assert all('seed' in run and 'mIoU' in run for run in saved['runs'])
    assert all(d < 0 for d in summary['softmax']['paired_deltas']), \
        'docs/mixers.md: softmax is below the cosine NaLa at every seed'
    table = []
    for s in summary.values():
        per_seed = ', '.join(f'{d:+.2f}' for d in s['paired_deltas'])
        table.append(row(s['label'], str(s['runs']), f"{s['mIoU_mean']:.2f} ± {s['mIoU_std']:.2f}",
                         f"{s['paired_delta_mean']:+.2f} ± {s['paired_delta_std']:.2f} "
                         f'({per_seed})', f2(s['sec_per_iter_best'])))
    stds = [s['mIoU_std'] for s in summary.values()]
    speeds = [s['sec_per_iter_best'] for s in summary.values()]
    minutes = sum(run['wall_seconds'] for run in saved['runs']) / 60
    return {'docs/mixers.md': table + [
        Quote(f'std {min(stds):.2f} to {max(stds):.2f} mIoU'),
        Quote(f'({min(speeds):.2f} to {max(speeds):.2f} s at each'),
        Quote(f'took {minutes:.0f} min')]}


def flops_variants() -> Quotes:
    rows = markdown_rows('flops_variants.md')
    with open(results_path('flops_variants.md')) as f:
        header = next(line for line in f if line.startswith('| variant'))
    names = [c.strip() for c in header.strip().strip('|').split('|')]
    variants = [dict(zip(names, r)) for r in rows]
    assert [v['variant'] for v in variants] == ['XT', 'T', 'S', 'B', 'L']
    fidelity, method = [], []
    for v in variants:
        params, with_tail, paper = (v['backbone params w/o out norms (M)'],
                                    v['classifier-equivalent G'], v['paper G'])
        versus = f'{(float(with_tail) / float(paper) - 1) * 100:+.1f} %'
        fidelity.append(row(v['variant'], params, v['+ tail params (M)'], v['paper params (M)'],
                            v['backbone G'], with_tail, paper, versus))
        method.append(cells(v['variant'], params))
    t = variants[1]
    readme = Quote(f"vs the paper's {t['paper G']} | {t['classifier-equivalent G']} |")
    return {'docs/fidelity.md': fidelity, 'docs/method.md': method, 'README.md': [readme]}


def attention() -> Quotes:
    saved = load('attention.json')
    rows = {(r['impl'], r['tokens']): r for r in saved['rows']}
    paired = {(p['what'], p['tokens'], p['mode']): p['speedup_median'] for p in saved['paired']}
    n = 16384

    def memory(what: str) -> float:  # ours / released, forward + backward peak
        return rows[(f'{what}_fast' if what == 'layer' else 'nala_fast', n)]['fwd_bwd_mib'] / \
            rows[(f'{what}_released' if what == 'layer' else 'nala_released', n)]['fwd_bwd_mib']

    fast, explicit = rows[('nala_fast', n)], rows[('softmax_explicit', n)]
    sdpa = rows[('softmax_sdpa', n)]
    saving = (1 - fast['fwd_bwd_mib'] / explicit['fwd_bwd_mib']) * 100
    layer = f"{paired[('layer', n, 'fwd_bwd')]:.2f}× faster"
    return {
        'docs/speed.md': verbatim('attention.md') + [
            Quote(f"relative L2 of {saved['layers_relative_l2']:.1e} before timing"),
            Quote(f'the whole layer is {layer} than the released sequence in turns and needs '
                  f"{memory('layer'):.2f} of its peak memory; the op alone is "
                  f"{paired[('op', n, 'fwd_bwd')]:.2f}× faster with {memory('op'):.2f} of the "
                  f'memory'),
            Quote(f"needs {saving:.2f}% less memory ({fast['fwd_bwd_mib']:.1f} MiB vs "
                  f"{explicit['fwd_bwd_mib'] / 1024:.2f} GiB) and "
                  f"1/{explicit['fwd_bwd_ms'] / fast['fwd_bwd_ms']:.0f} of the time"),
            Quote(f"close in memory ({sdpa['fwd_bwd_mib']:.1f} MiB) but "
                  f"{sdpa['fwd_bwd_ms'] / fast['fwd_bwd_ms']:.0f}× slower")],
        'README.md': [Quote(f"{layer}, {memory('layer'):.2f} of the peak memory |"),
                      Quote(f'{n:,} tokens | {saving:.2f}% less peak memory |')],
    }


def sweep(name: str, prefix: str) -> Tuple[List[Quote], Dict[Tuple[str, int], dict], dict]:
    """Rows of a NaLa-vs-Swin comparison table (time ratio, speed-up, memory ratio, peaks),
    the all-linear NaLaFormer-T rows by (mode, side), and the file."""
    saved = load(name)
    by_key = {(r['model'], r['mode'], r['side']): r for r in saved['rows']}
    quotes, ours = [], {}
    for (model, mode, side), r in by_key.items():
        if model != 'nala_t_linear' or r.get('ms_ratio') is None:
            continue
        ours[(mode, side)] = r
        swin = by_key[('swin_t', mode, side)]
        first = f'{prefix}forward {side}²' if mode == 'fwd' else \
            f"{prefix}training step {side}², batch {r['batch']}"
        quotes.append(row(first, f2(r['ms_ratio']), f"{1 / r['ms_ratio']:.2f}×",
                          f2(r['mib_ratio']), f"{r['mib']:.0f} vs {swin['mib']:.0f} MiB"))
    assert quotes, f'{name} has no timed all-linear NaLaFormer-T row'
    return quotes, ours, saved


def headline(r: dict) -> str:
    return f"{f2(r['ms_ratio'])} of the time, {f2(r['mib_ratio'])} of the peak memory |"


def backbone() -> Quotes:
    quotes, ours, saved = sweep('backbone.json', '')
    exponents = verbatim('backbone.md', lambda r: len(r) == 4)
    return {'docs/speed.md': quotes + exponents + [
                Quote(f"{saved['repeats']} rounds after a warm-up round")],
            'README.md': [
                Quote(f"forward 2048² | {headline(ours[('fwd', 2048)])}"),
                Quote(f"training step 1024², batch 2 | {headline(ours[('train', 1024)])}")]}


def segmentor() -> Quotes:
    quotes, ours, saved = sweep('segmentor.json', 'UperNet ')
    swin = next(r for r in saved['rows']
                if r['model'] == 'swin_t' and r['mode'] == 'fwd' and r['side'] == 2048)
    exponents = verbatim('segmentor.md', lambda r: len(r) == 4)
    return {'docs/speed.md': quotes + exponents + [
                Quote(f"{saved['repeats']} rounds after a warm-up round"),
                Quote(f"Inference at 2048² takes {ours[('fwd', 2048)]['ms'] / 1000:.0f} s against "
                      f"Swin-T's {swin['ms'] / 1000:.0f} s")],
            'README.md': [Quote(f'inference 2048² | {headline(ours[("fwd", 2048)])}')]}


def conv_weight_grad() -> Quotes:
    load('conv_weight_grad.json')
    return {'docs/speed.md': verbatim('conv_weight_grad.md')}


def deploy() -> Quotes:
    saved = load('deploy.json')
    runs = [run for model in saved['models'].values() for run in model['onnx']]
    ratios = [run['ratio_ort_over_eager'] for run in runs]
    exports = [Quote(f"{model['label']} {model['export_s']:.0f} s")
               for model in saved['models'].values()]
    linear_512 = saved['models']['nala_t_linear']['onnx'][0]
    assert linear_512['side'] == 512
    return {
        'docs/deploy.md': verbatim('deploy.md') + exports + [
            Quote(f"within a relative L2 error of {max(r['rel_l2'] for r in runs):.1e} at both "
                  f'sizes, and takes {min(ratios):.2f} to {max(ratios):.2f} of PyTorch eager')],
        'README.md': [Quote(f"relative L2 error {linear_512['rel_l2']:.1e}, "
                            f"{linear_512['ratio_ort_over_eager']:.2f} of the time |")],
    }


def amp() -> Quotes:
    saved = load('amp.json')
    fp32, amp_row = (next(r for r in saved['rows'] if r['precision'] == p) for p in ('fp32', 'amp'))
    speedup = fp32['median_ms'] / amp_row['median_ms']
    memory = amp_row['peak_mib'] / fp32['peak_mib']
    return {'docs/robustness.md': verbatim('amp.md') + [
                Quote(f'{speedup:.2f}× faster and takes its peak memory to {memory:.2f} of fp32')],
            'README.md': [Quote(f'{speedup:.2f}× faster, {memory:.2f} of the peak memory |')]}


# results file -> the builder of what the pages quote from it
def swap() -> Quotes:
    saved = load('swap.json')
    rows = {(r['model'], r['side']): r for r in saved['rows']}
    assert all(r.get('ms') is not None and r.get('mib') is not None for r in rows.values()), \
        'docs/swap.md quotes every model at every size'
    all_nala, nala12 = rows[('swin_t_nala_all', 2048)], rows[('swin_t_nala12', 2048)]
    mit = rows[('mit_b0_nala12', 2048)]
    return {'docs/swap.md': verbatim('swap.md') + [
                Quote(f"{saved['repeats']} rounds after a"),
                # the run's thread count, as the page's command gives it ('CPU, 1 thread')
                Quote(f"--threads {saved['device'].split()[1]}")],
            'README.md': [
                Quote(f"one pinned core | {f2(nala12['ms_ratio'])} of the time, "
                      f"{f2(nala12['mib_ratio'])} of the peak memory (NaLa in all stages: "
                      f"{f2(all_nala['ms_ratio'])} and {f2(all_nala['mib_ratio'])}) |"),
                Quote(f"one pinned core | {f2(mit['ms_ratio'])} of the time, "
                      f"{f2(mit['mib_ratio'])} of the peak memory |")]}


def swap_finetune() -> Quotes:
    saved = load('swap_finetune.json')
    assert len(saved['runs']) >= 3, 'the study needs >= 3 seeds'
    return {'docs/swap.md': verbatim('swap_finetune.md')}


def vit() -> Quotes:
    saved = load('vit.json')
    rows = {(r['width'], r['engine'], r['mode'], r['side']): r for r in saved['rows']}
    s, b = rows[('s', 'nala', 'fwd', 2048)], rows[('b', 'nala', 'fwd', 2048)]
    s4, b4 = rows[('s', 'nala', 'fwd', 4096)], rows[('b', 'nala', 'fwd', 4096)]
    stock_b = rows[('b', 'stock', 'fwd', 2048)]
    assert stock_b.get('skipped') and not s4.get('skipped') and not b4.get('skipped')
    skipped = [rows[(w, 'stock', 'fwd', 4096)] for w in ('s', 'b')]
    sdpa_s4 = rows[('s', 'sdpa', 'fwd', 4096)]
    b512, b512_train = rows[('b', 'nala', 'fwd', 512)], rows[('b', 'nala', 'train', 512)]
    train_s, train_b = rows[('s', 'nala', 'train', 1024)], rows[('b', 'nala', 'train', 1024)]
    reduction = saved['memory_reduction_vs_stock']['s']
    assert reduction['side'] == 2048  # the largest size where both ran

    def r3(x):
        return f'{x:.3f}'
    summary = [r for r in markdown_rows('vit.md') if r[0] in ('S', 'B')]
    return {
        'docs/vit.md': [row(*r) for r in summary] + [
            Quote(f"ViT-S forward takes {r3(s['ms_vs_stock'])} of the stock model's time and "
                  f"{r3(s['mib_vs_stock'])} of its peak memory: "
                  f"{reduction['percent_less']:.1f} % less"),
            Quote("beside the paper's 92.3 % at 70K+ tokens"),
            Quote(f"it is {r3(s['ms_vs_sdpa'])} of the time at the same memory, and ViT-B at "
                  f"2048² takes {r3(b['ms_vs_sdpa'])} of SDPA's time"),
            Quote(f"({stock_b['predicted_mib'] / 1024:.1f} GiB predicted)"),
            Quote(f"ViT-S in {s4['ms'] / 1e3:.1f} s and ViT-B in {b4['ms'] / 1e3:.1f} s with "
                  f"{b4['mib'] / 1024:.2f} GiB of peak memory"),
            Quote(f"the stock models would need {skipped[0]['predicted_mib'] / 1024:.1f} and "
                  f"{skipped[1]['predicted_mib'] / 1024:.1f} GiB, and SDPA's ViT-S "
                  f"{sdpa_s4['predicted_ms'] / 6e4:.1f} min a call"),
            Quote(f"ViT-B forward is {r3(b512['ms_vs_sdpa'])} of SDPA's time and its training "
                  f"step {r3(b512_train['ms_vs_sdpa'])}"),
            Quote(f"takes {r3(train_s['ms_vs_stock'])} (ViT-S) and {r3(train_b['ms_vs_stock'])} "
                  f"(ViT-B) of the stock model's time and {r3(train_b['mib_vs_stock'])} of its "
                  f"memory")],
        'README.md': [
            Quote(f"| {r3(s['ms_vs_stock'])} of the time, {r3(s['mib_vs_stock'])} of the peak "
                  f"memory ({reduction['percent_less']:.1f} % less) |"),
            Quote(f"| {r3(b['ms_vs_sdpa'])} of the time; ViT-B at 4096² in "
                  f"{b4['ms'] / 1e3:.1f} s, {b4['mib'] / 1024:.2f} GiB |")]}


def vit_cityscapes() -> Quotes:
    saved = load('vit_cityscapes.json')
    by = {r['case']: r for r in saved['rows']}
    whole, slide, stock_slide, stock_whole, large = (
        by[k] for k in ('nala_whole', 'nala_slide', 'stock_slide', 'stock_whole',
                        'nala_whole_4096'))
    # what the page and the SETR config's comment claim in words
    assert whole['ms'] < 0.5 * slide['ms'] and whole['mib'] > slide['mib']
    assert whole['ms'] < stock_slide['ms'] and whole['mib'] < stock_slide['mib']

    def r3(x):
        return f'{x:.3f}'

    def memory(mib):
        return f'{mib / 1024:.2f} GiB' if mib >= 1024 else f'{mib:.0f} MiB'
    # an empty note cell reads '| |' once the page's whitespace is normalised: quote up to it
    table = [row(*(r[:-1] if r[-1] == '' else r)) for r in markdown_rows('vit_cityscapes.md')]
    return {'docs/vit.md': table + [
        Quote(f"NaLa's SETR on the whole image takes {r3(whole['ms_vs_stock_slide'])} of the "
              f"time of the stock windows and {r3(whole['mib_vs_stock_slide'])} of their peak "
              "memory"),
        Quote(f"against its own windows it takes {r3(whole['ms'] / slide['ms'])} of the time for "
              f"{r3(whole['mib'] / slide['mib'])} of the memory"),
        Quote(f"The stock SETR takes {stock_slide['ms'] / 1e3:.1f} s and "
              f"{memory(stock_slide['mib'])} over its windows, and "
              f"{stock_whole['ms'] / 1e3:.1f} s and {memory(stock_whole['mib'])} on the whole "
              f"image ({stock_whole['predicted_mib'] / 1024:.2f} GiB predicted"),
        Quote(f"NaLa's SETR runs in {large['ms'] / 1e3:.1f} s with {memory(large['mib'])} of "
              "peak memory")]}


def linearize_choices() -> Quotes:
    saved = load('linearize_choices.json')
    runs = {tuple(r['options'][k] for k in ('target', 'inputs', 'params', 'lr')): r
            for r in saved['results'] if not r.get('plain_swap')}

    def miou(target, inputs, params, lr=1e-3):
        return runs[(target, inputs, params, lr)]['zero_shot_mIoU']

    def span(values, digits=1):
        return f'{min(values):.{digits}f} to {max(values):.{digits}f}'
    grid = [(t, i, p) for t in ('block', 'attention') for i in ('teacher', 'sequence')
            for p in ('mixer', 'new')]
    targets = [abs(miou('block', i, p) - miou('attention', i, p)) for _, i, p in grid]
    assert max(targets) < 0.5  # 'the same zero-shot mIoU within 0.5'
    sequence = [miou(t, 'sequence', 'mixer') - miou(t, 'teacher', 'mixer')
                for t in ('block', 'attention')]
    slower = [100 * (runs[(t, 'sequence', 'mixer', 1e-3)]['seconds']
                     / runs[(t, 'teacher', 'mixer', 1e-3)]['seconds'] - 1)
              for t in ('block', 'attention')]
    new_parts = [miou(t, 'teacher', 'new') - miou(t, 'sequence', 'new')
                 for t in ('block', 'attention')]
    params = [miou(t, i, 'mixer') - miou(t, i, 'new') for t, i, _ in grid]
    best = ('block', 'sequence', 'mixer')
    same = abs(miou(*best, 3e-3) - miou(*best))
    assert same < 0.1  # '3e-3 scores the same within 0.1'
    return {'docs/linearize.md': verbatim('linearize_choices.md') + [
        Quote('the same zero-shot mIoU within 0.5'),
        Quote(f'it scores {span(sequence)} higher, at {span(slower, 0)} % more time'),
        Quote(f'(with the new parts alone {max(new_parts):.1f} lower)'),
        Quote(f'scores {span(params)} mIoU less at every target and input'),
        Quote(f'(3e-3 scores the same within 0.1, 3e-4 '
              f'{miou(*best) - miou(*best, 3e-4):.1f} less)')]}


def linearize_iterations() -> Quotes:
    saved = load('linearize_iterations.json')
    by = {s['iters']: s for s in saved['summary']}
    assert by[200]['over_teacher'] < 0.9 <= by[800]['over_teacher']  # '800 or more' for a ViT

    def pct(iters):
        return f"{100 * by[iters]['over_teacher']:.1f} %"
    return {'docs/linearize.md': verbatim('linearize_iterations.md') + [
        Quote(f"(mIoU {saved['teacher']['teacher_mIoU']:.2f}: a second training run"),
        Quote(f'stop short on this teacher too ({pct(200)}); 800 reach {pct(800)} of the '
              f"teacher's mIoU and 2,000 reach {pct(2000)}, in {by[2000]['seconds']:.1f} s of "
              'transfer')]}


def linearize() -> Quotes:
    saved = load('linearize.json')
    quotes = []
    for teacher in ('swin', 'vit'):
        entry = saved['teachers'][teacher]
        assert len(entry['runs']) >= 3, 'the study needs all arms x 3 seeds'
        header = next(r for r in markdown_rows('linearize.md') if r[0] == 'plain swap, fine-tuned')
        quotes += [row(*r) for r in markdown_rows('linearize.md')
                   if r[0] in ('plain swap, fine-tuned', 'swap + attention transfer, fine-tuned',
                               'softmax continued') and len(r) == len(header)]
    swin, vit_ = saved['teachers']['swin'], saved['teachers']['vit']
    ss, vs = swin['summary'], vit_['summary']

    def pct(x):
        return f'{100 * x:.1f} %'

    def feature0(entry, arm):
        return mean(next(r['rel_l2_after'] for r in run[f'{arm}_report']['rows']
                         if r['name'] == 'features.0') for run in entry['runs'])
    start = vit_['start']
    return {
        'docs/linearize.md': quotes + [
            Quote(f"teacher mIoU {swin['start']['teacher_mIoU']:.2f}"),
            Quote(f"keeps {pct(ss['plain']['zero_shot_over_teacher'])} of the teacher's mIoU"),
            Quote(f"starts at {pct(ss['transfer']['zero_shot_over_teacher'])} of the teacher's "
                  f"mIoU"),
            Quote('after ' + ', '.join(map(str, ss['transfer']['iters_to_softmax'][:-1])) +
                  f" and {ss['transfer']['iters_to_softmax'][-1]} labelled iterations, ending "
                  f"{ss['transfer']['mean'][-1] - ss['softmax']['mean'][-1]:.2f} above it"),
            Quote(f"from about {feature0(swin, 'plain'):.2f} to {feature0(swin, 'transfer'):.2f} "
                  f"at stage 1"),
            Quote(f"It took {ss['transfer_seconds']:.1f} s for 200 iterations"),
            Quote(f"reaches mIoU {start['teacher_mIoU']:.2f} against {start['control_mIoU']:.2f} "
                  f"for the control that mixes no tokens (a gap of {start['gap']:.2f}"),
            Quote(f"({vs['plain']['mean'][0]:.2f}, {pct(vs['plain']['zero_shot_over_teacher'])} "
                  f"of the teacher)"),
            Quote(f"({vs['transfer']['mean'][0]:.2f}, "
                  f"{pct(vs['transfer']['zero_shot_over_teacher'])}: just short of the 90 % goal)"),
            Quote(f"from about {feature0(vit_, 'plain'):.2f} to "
                  f"{feature0(vit_, 'transfer'):.2f}. "),
            Quote(f"ends {vs['transfer']['mean'][-1] - vs['plain']['mean'][-1]:.2f} above the "
                  f"plain swap"),
            Quote(f"reaches the softmax arm ({vs['softmax']['mean'][-1]:.2f})")],
        'README.md': [
            Quote(f"| {pct(ss['transfer']['zero_shot_over_teacher'])} of the teacher's, against "
                  f"{pct(ss['plain']['zero_shot_over_teacher'])} for a plain swap |")]}


QUOTES: Dict[str, Callable[[], Quotes]] = {
    'vit.json': vit, 'vit_cityscapes.json': vit_cityscapes, 'linearize.json': linearize,
    'linearize_choices.json': linearize_choices, 'linearize_iterations.json': linearize_iterations,
    'swap.json': swap, 'swap_finetune.json': swap_finetune,
    'demo_seg.json': demo_seg, 'demo_det.json': demo_det, 'out_norm_study.json': out_norm_study,
    'ablation.json': ablation, 'flops_variants.md': flops_variants, 'attention.json': attention,
    'backbone.json': backbone, 'segmentor.json': segmentor,
    'conv_weight_grad.json': conv_weight_grad, 'deploy.json': deploy, 'amp.json': amp,
}


def quotes_of(page: str) -> Dict[str, List[Quote]]:
    """Results file -> what ``page`` must quote from it (every builder runs: files must exist)."""
    return {name: build().get(page, []) for name, build in QUOTES.items()}


# ------------------------------------------------------------------------------ pages
@dataclass
class Page:
    text: str  # one line per source line, code lines emptied, whitespace and ** normalised
    scan: str  # the same length, inline code and link targets blanked: where numbers are swept

    @property
    def flat(self) -> str:
        return self.text.replace('\n', ' ')


INLINE_CODE = re.compile(r'`[^`]*`')
LINK_TARGET = re.compile(r'\]\([^)]*\)')


def _blank(match: re.Match) -> str:
    return ' ' * len(match.group(0))


def source(page: str) -> str:
    path = osp.join(REPO, page)
    assert osp.exists(path), f'{page} is missing'
    with open(path, encoding='utf-8') as f:
        return f.read()


def read_page(page: str) -> Page:
    """The page as :class:`Page`: code emptied, whitespace normalised."""
    path = osp.join(REPO, page)
    assert osp.exists(path), f'{page} is missing'
    text, scan, fenced = [], [], False
    with open(path, encoding='utf-8') as f:
        for raw in f:
            line = raw.rstrip('\n')
            if line.lstrip().startswith('```'):
                fenced = not fenced
                line = ''
            elif fenced or line.startswith('    ') or line.lstrip().startswith('<!--'):
                line = ''  # code (commands, settings, formulas) and snippet markers
            line = ' '.join(line.replace('**', '').split())
            text.append(line)
            scan.append(LINK_TARGET.sub(_blank, INLINE_CODE.sub(_blank, line)))
    return Page('\n'.join(text), '\n'.join(scan))


def find(page: Page, quote: Quote) -> List[Tuple[int, int]]:
    """Spans of ``quote`` in the page (inside its row when it names one)."""
    spans = []
    for match in re.finditer(re.escape(quote.text), page.flat):
        start, end = match.span()
        line_start = page.text.rfind('\n', 0, start) + 1
        line_end = page.text.find('\n', line_start)
        line = page.text[line_start:line_end if line_end >= 0 else len(page.text)]
        if quote.row is not None and (end > line_start + len(line)
                                      or not line.startswith(f'| {quote.row} |')):
            continue
        spans.append((start, end))
    return spans


VERSION = re.compile(r'(?<![\w.])\d+\.\d+\.\d+(?![\w.])')
NUMBER = re.compile(r'(?<![\w.])(\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)'
                    r'(\s?(?:×(?!\d)|%|ms\b|MiB\b|GiB\b|min\b|s\b))?')  # 3×3 is a size
BOUND = re.compile(r'[<>≤≥]\s?$')
POWER_OF_TEN = re.compile(r'1e[-+]?\d+$')


def measurements(page: Page) -> Iterator[Tuple[str, int, int]]:
    """Measurement-like numbers of a page: (token, start, end) in ``page.scan``."""
    versions = {m.start() for m in VERSION.finditer(page.scan)}
    for match in NUMBER.finditer(page.scan):
        number, unit = match.group(1), match.group(2)
        if match.start() in versions:
            continue  # a package version
        if not ('.' in number or 'e' in number or unit):
            continue  # a count or a setting written out (2,000 iterations, 160 images)
        if POWER_OF_TEN.match(number) or BOUND.search(page.scan[max(0, match.start() - 2):
                                                                match.start()]):
            continue
        yield number, match.start(), match.end()


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize('page', PAGES)
def test_page_quotes_match_their_results_files(page):
    content = read_page(page)
    problems = []
    for name, quotes in quotes_of(page).items():
        if quotes and f'{RESULTS}/{name}' not in source(page):
            problems.append(f'quotes {RESULTS}/{name} without naming it')
        problems += [f'{name}: expected {q.text!r}' + (f' in the row {q.row!r}' if q.row else '')
                     for q in quotes if not find(content, q)]
    assert not problems, f'{page}:\n  ' + '\n  '.join(problems)


@pytest.mark.parametrize('page', PAGES)
def test_every_results_file_a_page_names_is_committed(page):
    named = set(re.findall(r'benchmarks/results/([\w.-]+\.(?:json|md|png))', source(page)))
    missing = sorted(name for name in named if not osp.exists(results_path(name)))
    assert not missing, f'{page} names results files that are not committed: {missing}'


@pytest.mark.parametrize('page', PAGES)
def test_every_measurement_on_a_page_is_checked(page):
    content = read_page(page)
    covered = [span for quotes in quotes_of(page).values() for q in quotes
               for span in find(content, q)]
    allowed = NOT_MEASURED.get(page, {})
    unchecked = []
    for token, start, end in measurements(content):
        if token in allowed or any(s <= start and end <= e for s, e in covered):
            continue
        line = content.scan.count('\n', 0, start) + 1
        context = content.flat[max(0, start - 40):end + 20]
        unchecked.append(f'line {line}: {token!r} in ...{context}...')
    assert not unchecked, (
        f'{page} states numbers that no results file backs (quote them through QUOTES, or list '
        f'them in NOT_MEASURED with the reason):\n  ' + '\n  '.join(unchecked))


def test_readme_is_short():
    """The README is for users (at most 250 lines); the detail goes to docs/."""
    assert len(source('README.md').splitlines()) <= 250


def test_quotes_name_only_known_pages():
    for name, build in QUOTES.items():
        assert set(build()) <= set(PAGES), name


def headings(path: str) -> List[str]:
    """The headings of a markdown file (outside fenced code)."""
    found, fenced = [], False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if line.lstrip().startswith('```'):
                fenced = not fenced
            elif not fenced and line.startswith('#'):
                found.append(line.lstrip('#').strip())
    return found


def heading_anchors(path: str) -> set:
    """GitHub's anchors of a markdown file's headings."""
    return {re.sub(r'[^\w\- ]', '', h.lower()).replace(' ', '-') for h in headings(path)}


@pytest.mark.parametrize('page', PAGES)
def test_relative_links_resolve(page):
    """Links between the README, the docs and the results files point at files and headings
    that exist (the code's docstrings cite docs/method.md's headings too)."""
    targets = re.findall(r'\]\(([^)\s]+)\)', source(page))
    broken = []
    for target in targets:
        if re.match(r'[a-z]+://', target):
            continue
        path, _, anchor = target.partition('#')
        resolved = osp.normpath(osp.join(REPO, osp.dirname(page), path)) if path else \
            osp.join(REPO, page)
        if not osp.exists(resolved) or (anchor and anchor not in heading_anchors(resolved)):
            broken.append(target)
    assert not broken, f'{page}: broken links {broken}'


QUOTED = r'"[^"]+"|\'[^\']+\''  # a double-quoted name may hold an apostrophe
CITATION = re.compile(rf'docs/(\w+)\.md\s*[,(]\s*(?:see\s+)?((?:(?:{QUOTED})\s*,?\s*)+)')


def test_sections_the_code_cites_exist():
    """Docstrings and comments point at docs sections by heading (``docs/method.md, "Cubed
    keys"``): each cited heading exists, so renaming one breaks this test, not the pointer."""
    missing = []
    for folder in ('nala_mm', 'tools', 'benchmarks', 'configs'):
        for root, _, files in os.walk(osp.join(REPO, folder)):
            for name in files:
                if not name.endswith(('.py', '.sh')):
                    continue
                with open(osp.join(root, name), encoding='utf-8') as f:
                    code = ' '.join(re.sub(r'\n\s*#\s*', ' ', f.read()).split())
                for page, names in CITATION.findall(code):
                    path = osp.join(REPO, 'docs', f'{page}.md')
                    titles = {h.lower() for h in headings(path)} if osp.exists(path) else set()
                    missing += [f'{osp.relpath(osp.join(root, name), REPO)}: docs/{page}.md '
                                f'"{cited[1:-1]}"' for cited in re.findall(QUOTED, names)
                                if cited[1:-1].lower() not in titles]
    assert not missing, 'cited docs sections that do not exist:\n  ' + '\n  '.join(missing)
