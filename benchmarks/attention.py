"""Attention benchmark: NaLa fast path vs the released op sequence vs softmax, time and memory.

Stage-1 shape of NaLaFormer-T (C = 64, one head, 2D RoPE), B = 1, N = H*W tokens. Each
(implementation, N, mode) runs in its own process:
  * time: median of the repeats after warm-up (forward, or forward + backward);
  * memory: peak resident memory above the process's baseline on CPU (VmHWM, reset through
    /proc/self/clear_refs, with glibc told to return large blocks at once so that freed memory
    is not counted twice), or ``torch.cuda.max_memory_allocated`` on GPU.
Results: benchmarks/results/attention.{json,md,png}.

    python benchmarks/attention.py                 # all cases
    python benchmarks/attention.py --sizes 32 64   # square side lengths
"""
import argparse
import json
import os
import os.path as osp
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import median_ms, peak_memory_mib, spawn  # noqa: E402
from nala_mm.ops import NaLaConfig, apply_rope, nala_attention, rope_phasor, rope_table  # noqa: E402
from nala_mm.ops.nala_released import nala_attention_released  # noqa: E402

RESULTS = osp.join(osp.dirname(osp.abspath(__file__)), 'results')
IMPLEMENTATIONS = {
    'nala_fast': 'NaLa, fast path (ours)',
    'nala_released': 'NaLa, released op sequence',
    'softmax_explicit': 'softmax, explicit N x N',
    'softmax_sdpa': 'softmax, SDPA',
}
HEAD_DIM = 64
# Explicit softmax keeps >= one N x N float32 matrix; beyond this it is not run but bounded.
EXPLICIT_LIMIT_BYTES = 6 * 2 ** 30


def attention_fn(name: str, height: int, width: int, device: str):
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


def run_case(name: str, side: int, mode: str, measure: str, repeats: int, device: str) -> dict:
    torch.manual_seed(0)
    n_tokens = side * side
    fn = attention_fn(name, side, side, device)
    q, k, v = (torch.randn(1, 1, n_tokens, HEAD_DIM, device=device,
                           requires_grad=(mode == 'fwd_bwd')) for _ in range(3))
    grad = torch.randn(1, 1, n_tokens, HEAD_DIM, device=device)

    def step():
        if mode == 'fwd':
            with torch.no_grad():
                fn(q, k, v)
        else:
            fn(q, k, v).backward(grad)
            q.grad = k.grad = v.grad = None
        if device == 'cuda':
            torch.cuda.synchronize()

    if measure == 'memory':
        return dict(peak_mib=peak_memory_mib(step, device))
    return dict(median_ms=median_ms(step, repeats, device, warmup=3), repeats=repeats)


def write_markdown(rows: list, ratios: dict, device_name: str, path: str) -> None:
    lines = [f'# Attention benchmark ({device_name})', '',
             f'B = 1, one head, d = {HEAD_DIM}, 2D RoPE; time = median after warm-up; memory = '
             'peak above baseline.', '',
             '| implementation | N | fwd ms | fwd+bwd ms | fwd MiB | fwd+bwd MiB |',
             '|---|---|---|---|---|---|']
    for row in rows:
        def cell(key):
            value = row.get(key)
            return row.get(key + '_note', '-') if value is None else f'{value:.1f}'
        lines.append(f"| {IMPLEMENTATIONS[row['impl']]} | {row['tokens']} | {cell('fwd_ms')} | "
                     f"{cell('fwd_bwd_ms')} | {cell('fwd_mib')} | {cell('fwd_bwd_mib')} |")
    lines += ['', '## Ratios', ''] + [f'- {k}: {v}' for k, v in ratios.items()]
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def plot(rows: list, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl, label in IMPLEMENTATIONS.items():
        mine = [r for r in rows if r['impl'] == impl]
        for ax, key in zip(axes, ('fwd_bwd_ms', 'fwd_bwd_mib')):
            points = [(r['tokens'], r[key]) for r in mine if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker='o', label=label)
    for ax, title in zip(axes, ('forward + backward time (ms)', 'forward + backward peak (MiB)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('tokens N')
        ax.set_title(title)
        ax.grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def ratio(rows, impl_a, impl_b, tokens, key):
    a = next((r.get(key) for r in rows if r['impl'] == impl_a and r['tokens'] == tokens), None)
    b = next((r.get(key) for r in rows if r['impl'] == impl_b and r['tokens'] == tokens), None)
    return None if a is None or b is None else a / b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--case', nargs=6, help=argparse.SUPPRESS)
    parser.add_argument('--sizes', nargs='+', type=int, default=[32, 64, 128, 256],
                        help='square feature-map sides (N = side^2)')
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=RESULTS)
    args = parser.parse_args()
    if args.case:
        name, side, mode, measure, repeats, device = args.case
        print(json.dumps(run_case(name, int(side), mode, measure, int(repeats), device)))
        return

    from tqdm import tqdm
    device_name = torch.cuda.get_device_name() if args.device == 'cuda' else \
        f'CPU, {torch.get_num_threads()} threads'
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
            case = [impl, str(side), mode]
            timing = spawn(__file__, case + ['time', str(args.repeats), args.device], memory=False)
            memory = spawn(__file__, case + ['memory', '1', args.device], memory=True)
            row[f'{mode}_ms'] = timing.get('median_ms')
            row[f'{mode}_mib'] = memory.get('peak_mib')
            for result in (timing, memory):
                if 'error' in result:
                    row[f'{mode}_error'] = result['error']
        rows.append(row)

    ratios = {}
    n16k = next((s * s for s in args.sizes if s * s == 16384), None)
    if n16k:
        speed = ratio(rows, 'nala_released', 'nala_fast', n16k, 'fwd_bwd_ms')
        memory = ratio(rows, 'nala_fast', 'nala_released', n16k, 'fwd_bwd_mib')
        ratios['fast vs released at N=16384, fwd+bwd speed-up'] = \
            None if speed is None else f'{speed:.2f}x'
        ratios['fast / released at N=16384, fwd+bwd peak memory'] = \
            None if memory is None else f'{memory:.3f}'
    largest = max(args.sizes) ** 2
    fast_peak = next((r.get('fwd_bwd_mib') for r in rows
                      if r['impl'] == 'nala_fast' and r['tokens'] == largest), None)
    explicit = next((r for r in rows if r['impl'] == 'softmax_explicit'
                     and r['tokens'] == largest), {})
    explicit_peak = explicit.get('fwd_bwd_mib') or explicit.get('fwd_bwd_mib_lower_bound')
    if fast_peak and explicit_peak:
        bound = '' if explicit.get('fwd_bwd_mib') else ' (vs the lower bound of explicit softmax)'
        ratios[f'fast vs explicit softmax at N={largest}, peak memory reduction'] = \
            f'{100 * (1 - fast_peak / explicit_peak):.2f}%{bound}'
    fast_peaks = {r['tokens']: r.get('fwd_bwd_mib') for r in rows if r['impl'] == 'nala_fast'}
    for small, big in zip(args.sizes, args.sizes[1:]):
        low, high = fast_peaks.get(small * small), fast_peaks.get(big * big)
        if low and high:
            ratios[f'fast path fwd+bwd memory growth {small * small} -> {big * big} tokens'] = \
                f'{high / low:.2f}x for {(big / small) ** 2:.0f}x tokens'

    os.makedirs(args.out, exist_ok=True)
    stem = osp.join(args.out, 'attention' if args.device == 'cpu' else f'attention_{args.device}')
    with open(stem + '.json', 'w') as f:
        json.dump(dict(device=device_name, torch=torch.__version__, head_dim=HEAD_DIM,
                       rows=rows, ratios=ratios), f, indent=2)
    write_markdown(rows, ratios, device_name, stem + '.md')
    plot(rows, stem + '.png')
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
