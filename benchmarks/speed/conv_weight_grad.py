"""The block's conv weight gradients on CPU: oneDNN's own vs the paths of
:mod:`nala_mm.ops.fused.conv_weight_grad`, at NaLaFormer-T's training shapes (batch 2, 1024^2 and
512^2 images), channels-last inputs as the block holds them.

Cases: the 3x3/s2 downsamples (dense) and LePE's 5x5 depthwise conv at every stage's map size.
Each pair is timed in turns in a fresh process (:func:`benchmarks.lib.grid.run_grid`, time
only; median of the per-round ratios); the chosen path is what ``conv_weight_grad`` dispatches
to, so a size below its split threshold shows ~1.0.
Results: benchmarks/results/speed/conv_weight_grad.{json,md,png}.
Discussed in docs/reports/speed.md.

    python -m benchmarks.speed.conv_weight_grad [--repeats 5]
"""
import functools
import os

import torch

from nala_mm.analysis.measure import device_name
from nala_mm.ops.fused.conv_weight_grad import conv_weight_grad

from ..lib import report
from ..lib.grid import grid_cli, run_grid

# (label, in channels, out channels, kernel, stride, map side): NaLaFormer-T, batch 2
CASES = [(f'downsample {cin}->{cout}', cin, cout, 3, 2, side)
         for cin, cout, side in ((64, 128, 256), (128, 256, 128), (256, 512, 64))]
CASES += [(f'LePE 5x5 dw, {c} ch', c, c, 5, 1, side)
          for c, side in ((64, 256), (64, 128), (128, 128), (128, 64), (256, 64), (256, 32),
                          (512, 32), (512, 16))]
BATCH = 2


@functools.lru_cache(maxsize=1)  # both paths of a case get the same tensors
def case_steps(cin: int, cout: int, kernel: int, stride: int, side: int):
    groups = cin if cin == cout and kernel == 5 else 1
    x = torch.randn(BATCH, side, side, cin).permute(0, 3, 1, 2)  # channels-last view
    out_side = side // stride
    d_out = torch.randn(BATCH, out_side, out_side, cout).permute(0, 3, 1, 2)
    weight = torch.randn(cout, cin // groups, kernel, kernel)
    padding = (kernel // 2, kernel // 2)

    def onednn() -> None:
        torch.ops.aten.convolution_backward(d_out, x, weight, None, [stride] * 2, list(padding),
                                            [1, 1], False, [0, 0], groups, [False, True, False])

    def ours() -> None:
        conv_weight_grad(d_out, x, weight, (stride, stride), padding, groups)
    return dict(onednn=onednn, ours=ours)


def step_of(name: str, case: dict):
    """The grid's child: oneDNN's or our weight gradient at ``case``'s shape."""
    return case_steps(case['cin'], case['cout'], case['kernel'], case['stride'],
                      case['side'])[name]


def write_outputs(saved: dict, stem: str) -> None:
    """``stem.json`` (``saved``), the page ``stem.md`` and the plot ``stem.png``."""
    rows = saved['rows']
    report.write_json(stem + '.json', saved)
    lines = [f"# Conv weight gradients ({saved['device']})", '',
             f"torch {saved['torch']}; batch {saved['batch']}, channels-last inputs; oneDNN vs "
             f"nala_mm.ops.conv_weight_grad timed in turns, {saved['repeats']} rounds; speed-up = "
             'median of the per-round ratios.', '']
    lines += report.markdown_table(['case', 'map side', 'oneDNN ms', 'ours ms', 'speed-up'],
                            [[r['case'], r['side'], report.fmt(r['onednn_ms']),
                              report.fmt(r['ours_ms']), report.fmt(r['speedup'], 2)]
                             for r in rows])
    report.write_markdown(stem + '.md', lines)
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh([f"{r['case']} @ {r['side']}²" for r in rows], [r['speedup'] or 0 for r in rows])
    ax.axvline(1.0, color='k', lw=0.8)
    ax.set_xlabel('speed-up over oneDNN (median of per-round ratios)')
    ax.invert_yaxis()
    report.save_figure(fig, stem + '.png')


def main() -> None:
    parsed = grid_cli(__doc__, 'conv_weight_grad', step_of, write_outputs,
                      lambda parser: parser.add_argument('--repeats', type=int, default=5),
                      devices=False)  # the CPU weight-gradient paths
    if parsed is None:
        return
    args, stem = parsed
    cases = [(dict(case=label, cin=cin, cout=cout, kernel=kernel, stride=stride, side=side),
              ['onednn', 'ours']) for label, cin, cout, kernel, stride, side in CASES]
    grid = run_grid(__spec__.name, cases, repeats=args.repeats, warmup=1, device='cpu',
                    reference='ours', memory=False, desc='weight gradients')
    rows = []
    for onednn, ours in zip(grid[::2], grid[1::2]):  # one row per case: the two paths
        rows.append(dict(case=onednn['case'], side=onednn['side'], onednn_ms=onednn['ms'],
                         ours_ms=ours['ms'], speedup=onednn['ms_ratio']))
    os.makedirs(args.out, exist_ok=True)
    write_outputs(dict(device=device_name('cpu'), torch=torch.__version__, batch=BATCH,
                       repeats=args.repeats, rows=rows), stem)
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
