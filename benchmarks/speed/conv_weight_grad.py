"""The block's conv weight gradients on CPU: oneDNN's own vs the paths of
:mod:`nala_mm.ops.fused.conv_weight_grad`, at NaLaFormer-T's training shapes (batch 2, 1024^2 and
512^2 images), channels-last inputs as the block holds them.

Cases: the 3x3/s2 downsamples (dense) and LePE's 5x5 depthwise conv at every stage's map size.
Each pair is timed in turns in one process (median of the per-round ratios); the chosen path is
what ``conv_weight_grad`` dispatches to, so a size below its split threshold shows ~1.0.
Results: benchmarks/results/conv_weight_grad.{json,md,png}.
Discussed in docs/speed.md.

    python benchmarks/conv_weight_grad.py [--repeats 5]
"""
import argparse
import os
import os.path as osp
from statistics import median

import torch

from nala_mm.analysis.measure import device_name, interleaved_ms
from nala_mm.ops.fused.conv_weight_grad import conv_weight_grad

from paths import RESULTS
from report import markdown_table, pyplot, save_figure, write_json, write_markdown

# (label, in channels, out channels, kernel, stride, map side): NaLaFormer-T, batch 2
CASES = [(f'downsample {cin}->{cout}', cin, cout, 3, 2, side)
         for cin, cout, side in ((64, 128, 256), (128, 256, 128), (256, 512, 64))]
CASES += [(f'LePE 5x5 dw, {c} ch', c, c, 5, 1, side)
          for c, side in ((64, 256), (64, 128), (128, 128), (128, 64), (256, 64), (256, 32),
                          (512, 32), (512, 16))]
BATCH = 2


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--out', default=RESULTS)
    args = parser.parse_args()
    from tqdm import tqdm
    rows = []
    for label, cin, cout, kernel, stride, side in tqdm(CASES, desc='weight gradients'):
        times = interleaved_ms(case_steps(cin, cout, kernel, stride, side), args.repeats)
        rows.append(dict(case=label, side=side, onednn_ms=median(times['onednn']),
                         ours_ms=median(times['ours']),
                         speedup=median(a / b for a, b in zip(times['onednn'], times['ours']))))
    os.makedirs(args.out, exist_ok=True)
    stem = osp.join(args.out, 'conv_weight_grad')
    write_json(stem + '.json', dict(device=device_name('cpu'), torch=torch.__version__,
                                    batch=BATCH, repeats=args.repeats, rows=rows))
    lines = [f'# Conv weight gradients ({device_name("cpu")})', '',
             f'torch {torch.__version__}; batch {BATCH}, channels-last inputs; oneDNN vs '
             f'nala_mm.ops.conv_weight_grad timed in turns, {args.repeats} rounds; speed-up = '
             'median of the per-round ratios.', '']
    lines += markdown_table(['case', 'map side', 'oneDNN ms', 'ours ms', 'speed-up'],
                            [[r['case'], r['side'], f"{r['onednn_ms']:.1f}",
                              f"{r['ours_ms']:.1f}", f"{r['speedup']:.2f}"] for r in rows])
    write_markdown(stem + '.md', lines)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh([f"{r['case']} @ {r['side']}²" for r in rows], [r['speedup'] for r in rows])
    ax.axvline(1.0, color='k', lw=0.8)
    ax.set_xlabel('speed-up over oneDNN (median of per-round ratios)')
    ax.invert_yaxis()
    save_figure(fig, stem + '.png')
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
