"""Attention benchmark: the NaLa op and the whole NaLa layer against the released op sequence,
and softmax, time and peak memory against the number of tokens.

Stage-1 shape of NaLaFormer-T (C = 64, one head, d = 64, 2D RoPE), B = 1, N = H*W tokens:

* op level, on ``(B, heads, N, d)`` q, k, v: our fast op (released ReLU kernel), the released op
  sequence (nala_mm/released_op.py), softmax with an explicit N x N matrix, and SDPA;
* layer level, the whole token mixer (qkvg, RoPE, NaLa, LePE, LayerNorm, SiLU gate, out_proj):
  ``NormAwareLinearAttention`` on channels-last tokens, as the backbone block runs it, against
  the released layer's op sequence on channels-first maps (token rearranges, the released op,
  LePE on a channels-first copy of v); the same parameters and outputs (checked).

Each (implementation, N, mode) runs in its own process (nala_mm.analysis.measure): time = median
after warm-up, memory = peak above the baseline. On CPU the speed-ups against the released
sequence are also timed in turns in one process (both engines each round; median of the
per-round ratios), which a shared machine's load drift cannot bias. Results:
benchmarks/results/attention.{json,md,png} (``attention_cuda.*`` on GPU).
Discussed in docs/speed.md.

    python benchmarks/attention.py                 # all cases
    python benchmarks/attention.py --sizes 32 64   # square side lengths
"""
import argparse
import os
import os.path as osp

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from nala_mm.analysis.measure import (
    add_case_argument,
    device_name,
    interleaved_ms,
    measure,
    print_case_result,
    run_case,
)
from nala_mm.models import NormAwareLinearAttention
from nala_mm.ops import NaLaConfig, apply_rope, nala_attention, rope_phasor, rope_table
from nala_mm.released_op import nala_attention_released

from paths import RESULTS
from report import (
    fmt,
    log_log_axes,
    markdown_table,
    pyplot,
    save_figure,
    write_json,
    write_markdown,
)

IMPLEMENTATIONS = {
    'nala_fast': 'NaLa op, fast (ours)',
    'nala_released': 'NaLa op, released op sequence',
    'softmax_explicit': 'softmax, explicit N x N',
    'softmax_sdpa': 'softmax, SDPA',
    'layer_fast': 'NaLa layer, ours (channels-last)',
    'layer_released': 'NaLa layer, released op sequence',
}
LAYERS = ('layer_fast', 'layer_released')
# (released, ours, what): timed in turns in one process for the speed-ups (see paired_speedup)
PAIRS = (('nala_released', 'nala_fast', 'op'), ('layer_released', 'layer_fast', 'layer'))
HEAD_DIM = 64
# Explicit softmax keeps >= one N x N float32 matrix; beyond this it is not run but bounded.
EXPLICIT_LIMIT_BYTES = 6 * 2 ** 30
# Untimed calls before a time is taken (kernel caches, RoPE tables, allocator growth); a memory
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


def ratio(rows, impl_a, impl_b, tokens, key):
    a = next((r.get(key) for r in rows if r['impl'] == impl_a and r['tokens'] == tokens), None)
    b = next((r.get(key) for r in rows if r['impl'] == impl_b and r['tokens'] == tokens), None)
    return None if a is None or b is None else a / b


def summarise(rows: list, sizes: list) -> dict:
    ratios = {}
    n16k = 16384 if 128 in sizes else None
    if n16k:
        for slow, fast, what in PAIRS:
            speed = ratio(rows, slow, fast, n16k, 'fwd_bwd_ms')
            memory = ratio(rows, fast, slow, n16k, 'fwd_bwd_mib')
            ratios[f'{what}: released / ours, fwd+bwd time at N=16384 (speed-up)'] = fmt(speed, 2)
            ratios[f'{what}: ours / released, fwd+bwd peak memory at N=16384'] = fmt(memory, 3)
    largest = max(sizes) ** 2
    fast_peak = next((r.get('fwd_bwd_mib') for r in rows
                      if r['impl'] == 'nala_fast' and r['tokens'] == largest), None)
    explicit = next((r for r in rows if r['impl'] == 'softmax_explicit'
                     and r['tokens'] == largest), {})
    explicit_peak = explicit.get('fwd_bwd_mib') or explicit.get('fwd_bwd_mib_lower_bound')
    if fast_peak and explicit_peak:
        bound = '' if explicit.get('fwd_bwd_mib') else ' (vs the lower bound of explicit softmax)'
        ratios[f'fast op vs explicit softmax at N={largest}, peak memory reduction'] = \
            f'{100 * (1 - fast_peak / explicit_peak):.2f}%{bound}'
    return ratios


def plot(rows: list, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl, label in IMPLEMENTATIONS.items():
        mine = [r for r in rows if r['impl'] == impl]
        for ax, key in zip(axes, ('fwd_bwd_ms', 'fwd_bwd_mib')):
            points = [(r['tokens'], r[key]) for r in mine if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker='o', label=label,
                        linestyle='--' if impl in LAYERS else '-')
    log_log_axes(axes[0], 'forward + backward time (ms)', 'tokens N')
    log_log_axes(axes[1], 'forward + backward peak (MiB)', 'tokens N')
    axes[0].legend(fontsize=8)
    save_figure(fig, path)


def paired_speedup(names, side: int, mode: str, repeats: int, device: str) -> dict:
    """Released vs ours timed in turns in one process (CPU): every round times both, so the
    load drift of a shared machine reaches both alike. The speed-up is the median of the
    per-round ratios; each one's best call is reported beside it."""
    slow, fast = names
    steps = {name: make_step(name, side, mode, device) for name in (slow, fast)}
    times = interleaved_ms(steps, repeats, warmup=TIME_WARMUP)
    ratios = sorted(a / b for a, b in zip(times[slow], times[fast]))
    return dict(speedup_median=ratios[len(ratios) // 2], rounds=repeats,
                released_best_ms=min(times[slow]), ours_best_ms=min(times[fast]))


def attention_case(case: dict) -> dict:
    """One case in this fresh process: a released/ours ``pair`` timed in turns, or one
    implementation's ``time`` or ``memory``."""
    if 'pair' in case:
        return paired_speedup(case['pair'], case['side'], case['mode'], case['repeats'],
                              case['device'])
    step = make_step(case['impl'], case['side'], case['mode'], case['device'])
    if case['what'] == 'memory':
        return measure(step, 'memory', repeats=1, warmup=1, device=case['device'])
    return measure(step, 'time', case['repeats'], TIME_WARMUP, case['device'])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_argument(parser)
    parser.add_argument('--sizes', nargs='+', type=int, default=[32, 64, 128, 256],
                        help='square feature-map sides (N = side^2)')
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=RESULTS)
    args = parser.parse_args()
    if args.case is not None:
        print_case_result(attention_case(args.case))
        return

    from tqdm import tqdm
    layers_rel_l2 = check_layers_agree(args.device)
    if layers_rel_l2 > 1e-5:
        raise RuntimeError(f'our layer and the released sequence differ (relative L2 '
                           f'{layers_rel_l2:.2e}): the comparison would not be like for like')
    rows = []
    cases = [(impl, side) for side in args.sizes for impl in IMPLEMENTATIONS]
    for impl, side in tqdm(cases, desc='attention cases'):
        tokens = side * side
        row = dict(impl=impl, tokens=tokens)
        explicit_bytes = 4 * tokens * tokens
        if impl == 'softmax_explicit' and args.device == 'cpu' \
                and explicit_bytes > EXPLICIT_LIMIT_BYTES:
            # not run: one N x N float32 score matrix alone is a lower bound of its peak
            for mode in ('fwd', 'fwd_bwd'):
                row[f'{mode}_ms_note'] = 'not run'
                row[f'{mode}_mib_note'] = f'>= {explicit_bytes / 2 ** 20:.0f} (bound)'
                row[f'{mode}_mib_lower_bound'] = explicit_bytes / 2 ** 20
            rows.append(row)
            continue
        for mode in ('fwd', 'fwd_bwd'):
            case = dict(impl=impl, side=side, mode=mode, device=args.device)
            timing = run_case(__file__, dict(case, what='time', repeats=args.repeats))
            memory = run_case(__file__, dict(case, what='memory'), memory=True)
            row[f'{mode}_ms'] = timing.get('median_ms')
            row[f'{mode}_mib'] = memory.get('peak_mib')
            for result in (timing, memory):
                if 'error' in result:
                    row[f'{mode}_error'] = result['error']
        rows.append(row)

    paired = []
    if args.device == 'cpu':
        for (slow, fast, what), side, mode in tqdm(
                [(p, side, mode) for side in args.sizes for p in PAIRS
                 for mode in ('fwd', 'fwd_bwd')], desc='paired timings'):
            result = run_case(__file__, dict(pair=[slow, fast], side=side, mode=mode,
                                             repeats=args.repeats, device=args.device))
            paired.append(dict(what=what, tokens=side * side, mode=mode, **result))
    ratios = summarise(rows, args.sizes)
    for row in paired:
        if row['tokens'] == 16384 and 'speedup_median' in row:
            ratios[f"{row['what']}: released / ours, {row['mode'].replace('_', '+')} time at "
                   f"N=16384, interleaved (median of per-round ratios)"] = \
                fmt(row['speedup_median'], 2)
    device = device_name(args.device)
    os.makedirs(args.out, exist_ok=True)
    stem = osp.join(args.out, 'attention' if args.device == 'cpu' else f'attention_{args.device}')
    write_json(stem + '.json', dict(device=device, torch=torch.__version__, head_dim=HEAD_DIM,
                                    layers_relative_l2=layers_rel_l2, rows=rows, paired=paired,
                                    ratios=ratios))

    def cell(row, key):
        return row.get(key + '_note', '-') if row.get(key) is None else f'{row[key]:.1f}'
    lines = [f'# Attention benchmark ({device})', '',
             f'B = 1, one head, d = {HEAD_DIM}, 2D RoPE; time = median after warm-up; memory = '
             'peak above baseline. Layers: the whole token mixer (C = 64); ours and the released '
             f'sequence agree to a relative L2 of {layers_rel_l2:.1e}.', '']
    lines += markdown_table(
        ['implementation', 'N', 'fwd ms', 'fwd+bwd ms', 'fwd MiB', 'fwd+bwd MiB'],
        [[IMPLEMENTATIONS[r['impl']], r['tokens']] +
         [cell(r, k) for k in ('fwd_ms', 'fwd_bwd_ms', 'fwd_mib', 'fwd_bwd_mib')] for r in rows])
    if paired:
        lines += ['', '## Released vs ours, timed in turns in one process', '',
                  f'{args.repeats} rounds; speed-up = median of the per-round ratios (robust to '
                  'load drift); best call of each beside it.', '']
        lines += markdown_table(
            ['what', 'N', 'mode', 'speed-up', 'released best ms', 'ours best ms'],
            [[r['what'], r['tokens'], r['mode'], fmt(r.get('speedup_median'), 2),
              fmt(r.get('released_best_ms')), fmt(r.get('ours_best_ms'))] for r in paired])
    lines += ['', '## Ratios', ''] + [f'- {k}: {v}' for k, v in ratios.items()]
    write_markdown(stem + '.md', lines)
    plot(rows, stem + '.png')
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
