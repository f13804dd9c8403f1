"""What swapping NaLa into a stock backbone costs: mmseg's Swin-T and SegFormer's MiT-B0 and
mmdet's PVTv2-B0, each stock against its NaLa-swapped versions (nala_mm.models.swap), inference at
512, 1024 and 2048 square.

Per family, the models are timed in turns in one process (time ratio = median of per-round ratios
against the stock parent) and each model's peak memory is taken in a fresh process of its own
(benchmarks/lib/sweep.py). Parameters and FLOPs (nala_mm.analysis.count_flops, which counts the
swapped mixers' fast op) come from one traced forward per model and size. The NaLa mixers use the
paper's cosine kernel (the 'nala' shorthand), as the configs in configs/swap/ do. Results:
benchmarks/results/speed/swap.{json,md,png}; discussed in docs/user_guides/swap.md.

    python -m benchmarks.speed.swap                                  # everything
    taskset -c 0 python -m benchmarks.speed.swap --threads 1         # one core of a shared machine
    python -m benchmarks.speed.swap --sizes 512 --families mit --repeats 2
"""
import argparse
import os
import os.path as osp
from typing import Dict, List

import torch
from torch import nn

from nala_mm.analysis.measure import add_case_argument, device_name, print_case_result
from nala_mm.models import DEFAULT_HYBRID

from ..lib import report
from ..lib.grid import grid_case, run_grid
from ..lib.paths import SPEED_RESULTS
from ..lib.sweep import grid_step, pixels, size_cases, sweep_plot

SWIN_T = dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7)
B0 = dict(embed_dims=32, num_layers=[2, 2, 2, 2], num_heads=[1, 2, 5, 8])
# family -> its models, the stock parent first (the reference of the family's ratios)
FAMILIES: Dict[str, Dict[str, dict]] = {
    'swin': {
        'swin_t': dict(label='Swin-T (stock, windowed softmax)', mixers=None),
        'swin_t_nala12': dict(label='Swin-T, NaLa in stages 1-2', mixers=DEFAULT_HYBRID),
        'swin_t_nala_all': dict(label='Swin-T, NaLa in all stages', mixers=('nala',) * 4),
    },
    'mit': {
        'mit_b0': dict(label='MiT-B0 (stock, spatial-reduction softmax)', mixers=None),
        'mit_b0_nala12': dict(label='MiT-B0, NaLa in stages 1-2', mixers=DEFAULT_HYBRID),
    },
    'pvt': {
        'pvtv2_b0': dict(label='PVTv2-B0 (stock, spatial-reduction softmax)', mixers=None),
        'pvtv2_b0_nala12': dict(label='PVTv2-B0, NaLa in stages 1-2', mixers=DEFAULT_HYBRID),
    },
}
MODELS = {name: dict(spec, family=family) for family, models in FAMILIES.items()
          for name, spec in models.items()}


def build(name: str) -> nn.Module:
    from mmdet.models.backbones import PyramidVisionTransformerV2
    from mmseg.models.backbones import MixVisionTransformer, SwinTransformer

    import nala_mm  # noqa: F401  (registers the swapped backbones)
    from nala_mm.models.swap import (
        NaLaMixVisionTransformer,
        NaLaPyramidVisionTransformerV2,
        SegNaLaSwinTransformer,
    )
    spec = MODELS[name]
    stock, swapped, kwargs = {
        'swin': (SwinTransformer, SegNaLaSwinTransformer, SWIN_T),
        'mit': (MixVisionTransformer, NaLaMixVisionTransformer, B0),
        'pvt': (PyramidVisionTransformerV2, NaLaPyramidVisionTransformerV2, B0),
    }[spec['family']]
    model = stock(**kwargs) if spec['mixers'] is None else swapped(mixers=spec['mixers'],
                                                                   **kwargs)
    model.eval()  # not chained: the stock Swin.train() returns None
    return model


def forward_step(name: str, side: int, mode: str, batch: int, device: str):
    model = build(name).to(device)
    image = torch.randn(batch, 3, side, side, device=device)

    def forward() -> None:
        with torch.no_grad():
            model(image)
    return forward


def flops_and_params(name: str, sides: List[int]) -> dict:
    from nala_mm.analysis import count_flops
    model = build(name)
    out = dict(params_m=sum(p.numel() for p in model.parameters()) / 1e6, gflops={})
    for side in sides:
        count = count_flops(model, (torch.randn(1, 3, side, side),))
        out['gflops'][str(side)] = count.total / 1e9
        out.setdefault('uncounted_ops', sorted(count.uncounted))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_argument(parser)
    parser.add_argument('--sizes', nargs='+', type=int, default=[512, 1024, 2048])
    parser.add_argument('--families', nargs='+', choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument('--repeats', type=int, default=3, help='timed rounds in turns')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--timeout', type=int, default=3600)
    parser.add_argument('--threads', type=int,
                        help='intra-op threads of every measuring process (default: torch\'s); '
                             'on a shared machine pin the run to free cores with taskset and '
                             'give as many threads')
    parser.add_argument('--out', default=SPEED_RESULTS)
    report.add_report_only_argument(parser, 'swap')
    args = parser.parse_args()
    if args.report_only:
        write_page(osp.join(args.out, 'swap' if args.device == 'cpu' else f'swap_{args.device}'))
        return
    if args.threads:
        os.environ['OMP_NUM_THREADS'] = str(args.threads)  # the measuring processes inherit it
        torch.set_num_threads(args.threads)
    if args.case is not None:
        print_case_result(grid_case(args.case, grid_step(forward_step)))
        return
    rows, costs = [], {}
    for family in args.families:
        models = FAMILIES[family]
        rows += run_grid(__spec__.name, size_cases(models, {'fwd': args.sizes}, {'fwd': 1}),
                         repeats=args.repeats, warmup=args.warmup, device=args.device,
                         reference=next(iter(models)), timeout=args.timeout, describe=pixels,
                         desc=family)
        for name in models:  # traced here: the measurements above ran in their own processes
            costs[name] = flops_and_params(name, args.sizes)
    for row in rows:  # ratios against the family's stock parent at the same size
        parent = next(iter(FAMILIES[MODELS[row['model']]['family']]))
        ref = next(r for r in rows if r['model'] == parent and r['side'] == row['side'])
        row['family'] = MODELS[row['model']]['family']
        row['mib_ratio'] = (row['mib'] / ref['mib']) if row.get('mib') and ref.get('mib') \
            else None
        row['gflops'] = costs[row['model']].get('gflops', {}).get(str(row['side']))
        row['params_m'] = costs[row['model']].get('params_m')

    chosen = {name: MODELS[name] for family in args.families for name in FAMILIES[family]}
    os.makedirs(args.out, exist_ok=True)
    path = osp.join(args.out, 'swap' if args.device == 'cpu' else f'swap_{args.device}')
    report.write_json(path + '.json', dict(device=device_name(args.device), torch=torch.__version__,
                                    repeats=args.repeats, warmup=args.warmup,
                                    models={k: v['label'] for k, v in chosen.items()},
                                    costs=costs, rows=rows))
    write_page(path)


def write_page(path: str) -> None:
    """``path.md`` and ``path.png`` from ``path.json`` (``--report-only`` redraws them alone)."""
    saved = report.read_json(path + '.json')
    models = {name: dict(label=label) for name, label in saved['models'].items()}
    lines = [f"# Stock backbones with NaLa swapped in ({saved['device']})", '',
             f"torch {saved['torch']}; inference, batch 1, eval mode, no grad. Time: the models of "
             f"a family timed in turns in one process, {saved['repeats']} rounds after "
             f"{saved['warmup']} warm-up round(s); ratio = median of the per-round ratios against "
             'the stock parent. Memory: peak of one forward above the baseline, each model in its '
             'own process. FLOPs: nala_mm.analysis.count_flops (one multiply-add = one flop).', '']
    errors = any('error' in r for r in saved['rows'])  # the column only when a case failed
    lines += report.markdown_table(
        ['model, input', 'params (M)', 'GFLOPs', 'median ms', 'time / stock', 'peak MiB',
         'memory / stock'] + ['error'] * errors,
        [[f"{models[r['model']]['label']}, {r['side']}²", report.fmt(r['params_m'], 2),
          report.fmt(r['gflops'], 1), report.fmt(r['ms']), report.fmt(r['ms_ratio'], 2),
          report.fmt(r['mib']),
          report.fmt(r['mib_ratio'], 2)] + [r.get('error', '')] * errors for r in saved['rows']])
    report.write_markdown(path + '.md', lines)
    sweep_plot(saved['rows'], models, path + '.png')
    print(open(path + '.md').read())


if __name__ == '__main__':
    main()
