"""Attention benchmark: the NaLa op and the whole NaLa layer against the released op sequence,
and softmax, time and peak memory against the number of tokens.

Stage-1 shape of NaLaFormer-T (C = 64, one head, d = 64, 2D RoPE), B = 1, N = H*W tokens:

* op level, on ``(B, heads, N, d)`` q, k, v: our fast op (released ReLU kernel), the released op
  sequence (tests/reference/released_op.py, the transcription the parity tests use), softmax
  with an explicit N x N matrix, and SDPA;
* layer level, the whole token mixer (qkvg, RoPE, NaLa, LePE, LayerNorm, SiLU gate, out_proj):
  ``NormAwareLinearAttention`` on channels-last tokens, as the backbone block runs it, against
  the released layer's op sequence on channels-first maps (token rearranges, the released op,
  LePE on a channels-first copy of v); the same parameters and outputs (checked).

On :func:`benchmarks.lib.grid.run_grid`: per (N, mode) each implementation's peak memory in a
fresh process of its own, then all of them timed in turns in one process, so that the speed-ups
against the released sequence (medians of per-round ratios) are not biased by a shared
machine's load drift. Explicit softmax is not run where its N x N matrix alone passes a limit
(its lower bound is recorded). Results: benchmarks/results/speed/attention.{json,md,png}
(``attention_cuda.*`` on GPU). Discussed in docs/reports/speed.md.

    python -m benchmarks.speed.attention                 # all cases
    python -m benchmarks.speed.attention --sizes 32 64   # square side lengths
    python -m benchmarks.speed.attention --report-only   # the page and plot from the JSON
"""
import argparse
import os

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from nala_mm.analysis.measure import device_name
from nala_mm.models import NormAwareLinearAttention
from nala_mm.ops import NaLaConfig, apply_rope, nala_attention, rope_phasor, rope_table
from tests.reference.released_op import nala_attention_released

from ..lib import report
from ..lib.grid import grid_cli, per_round_ratio, run_grid
from ..lib.provenance import code_version

IMPLEMENTATIONS = {
    'nala_fast': 'NaLa op, fast (ours)',
    'nala_released': 'NaLa op, released op sequence',
    'softmax_explicit': 'softmax, explicit N x N',
    'softmax_sdpa': 'softmax, SDPA',
    'layer_fast': 'NaLa layer, ours (channels-last)',
    'layer_released': 'NaLa layer, released op sequence',
}
LAYERS = ('layer_fast', 'layer_released')
# (released, ours, what): the speed-ups and memory ratios the page reports (pair_rows)
PAIRS = (('nala_released', 'nala_fast', 'op'), ('layer_released', 'layer_fast', 'layer'))
HEAD_DIM = 64
# Explicit softmax keeps >= one N x N float32 matrix; beyond this it is not run but bounded.
EXPLICIT_LIMIT_BYTES = 6 * 2 ** 30
# Untimed rounds before the timed ones (kernel caches, RoPE tables, allocator growth); a memory
# case runs one step before measuring, so one-time allocations are not the step's.
TIME_WARMUP = 3


class ReleasedNaLaLayer(nn.Module):
    """The released token mixer's op sequence on channels-first maps, with the parameters of
    ``layer`` (``qkvg``, ``lepe``, ``ln``, ``out_proj``)."""

    def __init__(self, layer: NormAwareLinearAttention):
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        layer, (height, width) = self.layer, x.shape[-2:]
        q, k, v, gate = layer.qkvg(rearrange(x, 'b c h w -> b (h w) c')).chunk(4, dim=-1)
        q, k, v = (rearrange(t, 'b n (m d) -> b m n d', m=layer.num_heads) for t in (q, k, v))
        rope = rope_table(height, width, layer.head_dims, device=x.device)
        mixed = rearrange(nala_attention_released(q, k, v, rope=rope), 'b m n d -> b n (m d)')
        v_map = rearrange(v, 'b m (h w) d -> b (m d) h w', h=height)
        lepe = rearrange(layer.lepe(v_map), 'b c h w -> b (h w) c')
        out = layer.out_proj(layer.ln(mixed + lepe) * F.silu(gate))
        return rearrange(out, 'b (h w) c -> b c h w', h=height)


def op_fn(name: str, height: int, width: int, device: str):
    cos, sin = (t.to(device) for t in rope_table(height, width, HEAD_DIM))
    cfg = NaLaConfig(kernel='relu')  # the released kernel: both NaLa forms compute the same
    phasor = rope_phasor(cos, sin)

    def softmax_inputs(q, k):
        return apply_rope(q, phasor), apply_rope(k, phasor)

    if name == 'nala_fast':
        return lambda q, k, v: nala_attention(q, k, v, cfg, (cos, sin))
    if name == 'nala_released':
        return lambda q, k, v: nala_attention_released(q, k, v, rope=(cos, sin))
    if name == 'softmax_sdpa':
        return lambda q, k, v: F.scaled_dot_product_attention(*softmax_inputs(q, k), v)

    def explicit(q, k, v):
        q, k = softmax_inputs(q, k)
        return torch.softmax(q @ k.transpose(-1, -2) * HEAD_DIM ** -0.5, dim=-1) @ v
    return explicit


def make_step(name: str, side: int, mode: str, device: str):
    torch.manual_seed(0)
    grad_needed = mode == 'fwd_bwd'
    if name in LAYERS:
        layer = NormAwareLinearAttention(HEAD_DIM, 1, kernel='relu').to(device)
        # channels-last tokens for ours, a channels-first map for the released sequence
        shape = (1, side, side, HEAD_DIM) if name == 'layer_fast' else (1, HEAD_DIM, side, side)
        module = layer if name == 'layer_fast' else ReleasedNaLaLayer(layer)
        x = torch.randn(*shape, device=device, requires_grad=grad_needed)
        inputs, fn = (x,), module
        grad = torch.randn(shape, device=device)
    else:
        fn = op_fn(name, side, side, device)
        inputs = tuple(torch.randn(1, 1, side * side, HEAD_DIM, device=device,
                                   requires_grad=grad_needed) for _ in range(3))
        grad = torch.randn(1, 1, side * side, HEAD_DIM, device=device)

    def step():
        if mode == 'fwd':
            with torch.no_grad():
                fn(*inputs)
        else:
            fn(*inputs).backward(grad)
            for t in inputs:
                t.grad = None
            if name in LAYERS:
                layer.zero_grad(set_to_none=True)
        if device == 'cuda':
            torch.cuda.synchronize()
    return step


def check_layers_agree(device: str) -> float:
    """Relative L2 between our layer and the released sequence on one input (same function)."""
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(HEAD_DIM, 1, kernel='relu').to(device)
    x = torch.randn(1, HEAD_DIM, 24, 20, device=device)
    with torch.no_grad():
        ours = layer(x.permute(0, 2, 3, 1).contiguous()).permute(0, 3, 1, 2)
        released = ReleasedNaLaLayer(layer)(x)
    return float((ours - released).norm() / released.norm())


def step_of(name: str, case: dict):
    """The grid's child: one call of implementation ``name`` in ``case``."""
    return make_step(name, case['side'], case['mode'], case['device'])


def describe(name: str, settings: dict) -> dict:
    return dict(tokens=settings['side'] ** 2)


def predictor(device: str):
    """Explicit softmax past :data:`EXPLICIT_LIMIT_BYTES` is not run on the CPU: one N x N
    float32 score matrix alone is a lower bound of its peak, recorded instead."""
    def predict(rows, name: str, settings: dict) -> dict:
        square = 4 * settings['side'] ** 4
        if name == 'softmax_explicit' and device == 'cpu' and square > EXPLICIT_LIMIT_BYTES:
            return dict(skipped='not run: one N x N float32 matrix is over the limit',
                        mib_lower_bound=square / 2 ** 20)
        return {}
    return predict


def pair_rows(rows: list) -> list:
    """Released against ours per size and mode: the speed-up (median of the per-round ratios,
    both timed in the same rounds) and ours' peak memory over the released sequence's."""
    found = []
    for slow, fast, what in PAIRS:
        for row in rows:
            if row['model'] != fast:
                continue
            other = next((r for r in rows if r['model'] == slow and r['side'] == row['side']
                          and r['mode'] == row['mode']), None)
            if other is None:
                continue
            found.append(dict(what=what, tokens=row['tokens'], mode=row['mode'],
                              speedup=per_round_ratio(other, row),
                              memory_ratio=row['mib'] / other['mib']
                              if row.get('mib') and other.get('mib') else None))
    return found


def memory_reduction(rows: list) -> dict:
    """The fast op's peak memory against explicit softmax at the largest size (its lower bound
    where explicit softmax did not run)."""
    largest = max(r['tokens'] for r in rows)
    ours = next((r for r in rows if r['model'] == 'nala_fast' and r['tokens'] == largest
                 and r['mode'] == 'fwd_bwd'), {})
    explicit = next((r for r in rows if r['model'] == 'softmax_explicit'
                     and r['tokens'] == largest and r['mode'] == 'fwd_bwd'), {})
    theirs = explicit.get('mib') or explicit.get('mib_lower_bound')
    if not ours.get('mib') or not theirs:
        return {}
    return dict(tokens=largest, percent_less=100 * (1 - ours['mib'] / theirs),
                against_lower_bound=explicit.get('mib') is None)


def plot(rows: list, path: str) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl, label in IMPLEMENTATIONS.items():
        mine = [r for r in rows if r['model'] == impl and r['mode'] == 'fwd_bwd']
        for ax, key in zip(axes, ('ms', 'mib')):
            points = [(r['tokens'], r[key]) for r in mine if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker='o', label=label,
                        linestyle='--' if impl in LAYERS else '-')
    report.log_log_axes(axes[0], 'forward + backward time (ms)', 'tokens N')
    report.log_log_axes(axes[1], 'forward + backward peak (MiB)', 'tokens N')
    axes[0].legend(fontsize=8)
    report.save_figure(fig, path)


def write_outputs(saved: dict, stem: str) -> None:
    """``stem.json`` (``saved``), the page ``stem.md`` and the plot ``stem.png``."""
    rows = saved['rows']
    saved['pairs'] = pair_rows(rows)
    saved['memory_reduction_vs_explicit'] = memory_reduction(rows)
    report.write_json(stem + '.json', saved)

    def cell(impl, tokens, mode, key):
        row = next((r for r in rows if r['model'] == impl and r['tokens'] == tokens
                    and r['mode'] == mode), {})
        if row.get(key) is not None:
            return f'{row[key]:.1f}'
        if key == 'mib' and row.get('mib_lower_bound'):
            return f">= {row['mib_lower_bound']:.0f} (bound)"
        return 'not run' if row.get('skipped') else '-'
    sizes = sorted({r['tokens'] for r in rows})
    lines = [f"# Attention benchmark ({saved['device']})", '',
             f"torch {saved['torch']}; B = 1, one head, d = {saved['head_dim']}, 2D RoPE. Time: "
             f"the implementations of one size and mode timed in turns in one process, "
             f"{saved['repeats']} rounds after {saved['warmup']} warm-up; memory: peak above "
             'the baseline, each in its own process. Layers: the whole token mixer (C = 64); '
             'ours and the released sequence agree to a relative L2 of '
             f"{saved['layers_relative_l2']:.1e}.", '']
    lines += report.markdown_table(
        ['implementation', 'N', 'fwd ms', 'fwd+bwd ms', 'fwd MiB', 'fwd+bwd MiB'],
        [[label, tokens] + [cell(impl, tokens, mode, key) for key in ('ms', 'mib')
                            for mode in ('fwd', 'fwd_bwd')]
         for tokens in sizes for impl, label in IMPLEMENTATIONS.items()])
    lines += ['', '## Released vs ours', '',
              'speed-up = the released sequence\'s time over ours, median of the per-round '
              'ratios; memory = our peak over the released sequence\'s.', '']
    lines += report.markdown_table(
        ['what', 'N', 'mode', 'speed-up', 'memory ours / released'],
        [[p['what'], p['tokens'], p['mode'], report.fmt(p['speedup'], 2),
          report.fmt(p['memory_ratio'], 3)]
         for p in saved['pairs']])
    reduction = saved['memory_reduction_vs_explicit']
    if reduction:
        bound = ' (against its lower bound)' if reduction['against_lower_bound'] else ''
        lines += ['', f"The fast op keeps {reduction['percent_less']:.2f} % less peak memory "
                      f"than explicit softmax at N = {reduction['tokens']}{bound}."]
    report.write_markdown(stem + '.md', lines)
    plot(rows, stem + '.png')


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--sizes', nargs='+', type=int, default=[32, 64, 128, 256],
                        help='square feature-map sides (N = side^2)')
    parser.add_argument('--repeats', type=int, default=10)


def main() -> None:
    parsed = grid_cli(__doc__, 'attention', step_of, write_outputs, arguments)
    if parsed is None:
        return
    args, stem = parsed

    layers_rel_l2 = check_layers_agree(args.device)
    if layers_rel_l2 > 1e-5:
        raise RuntimeError(f'our layer and the released sequence differ (relative L2 '
                           f'{layers_rel_l2:.2e}): the comparison would not be like for like')
    cases = [(dict(side=side, mode=mode), list(IMPLEMENTATIONS))
             for side in args.sizes for mode in ('fwd', 'fwd_bwd')]
    saved = dict(commit=code_version(), device=device_name(args.device), torch=torch.__version__,
                 head_dim=HEAD_DIM, repeats=args.repeats, warmup=TIME_WARMUP,
                 layers_relative_l2=layers_rel_l2)
    os.makedirs(args.out, exist_ok=True)
    run_grid(__spec__.name, cases, repeats=args.repeats, warmup=TIME_WARMUP, device=args.device,
             reference='nala_fast', predict=predictor(args.device), describe=describe,
             after_case=lambda rows: write_outputs(dict(saved, rows=rows), stem),
             desc='attention')
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
