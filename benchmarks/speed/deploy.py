"""Deployment benchmark: ONNX Runtime vs PyTorch eager for UperNet + NaLaFormer-T on CPU.

For the all-linear and the hybrid segmentor: one graph per model with dynamic H and W
(:func:`nala_mm.apis.export.export`, as ``tools/export_onnx.py --dynamic`` writes it: input
``(1, 3, H, W)``, output the logits at input resolution), exported at the first size and run at
every size in ONNX Runtime (CPUExecutionProvider) beside the same model in PyTorch eager (the
fast NaLa path). One process, same weights, same input:
  * parity: relative L2 error of ONNX Runtime's logits against PyTorch's;
  * time: both engines in turns (a round times each once; ``--repeats`` rounds after one warm-up
    round), so load drift on a shared machine reaches both; reported as medians, minima and the
    median of the per-round ratios ONNX Runtime / PyTorch. (Not on the grid of the other speed
    benchmarks: the engines share one exported graph and its session, in one process.)
torch.compile is measured in benchmarks/speed/compile.py.
Results: benchmarks/results/speed/deploy.{json,md,png}; discussed in docs/user_guides/deploy.md.

    python -m benchmarks.speed.deploy [--sides 512 1024] [--repeats 5 3]
    python -m benchmarks.speed.deploy --report-only    # the page and plot from the JSON
"""
import argparse
import os
import os.path as osp
import tempfile
import time
from statistics import median
from typing import Dict, List

import numpy as np
import torch

from nala_mm.analysis import attention_layers
from nala_mm.analysis.measure import interleaved_ms
from nala_mm.apis.export import DEFAULT_OPSET, build_exportable, export, ort_session, relative_l2
from nala_mm.models import LinearAttention, NormAwareLinearAttention, SoftmaxAttention

from ..lib import report
from ..lib.paths import REPO, SPEED_RESULTS

MODELS: Dict[str, dict] = {
    'nala_t_linear': dict(label='UperNet + NaLaFormer-T (all linear)',
                          config=osp.join(REPO, 'configs', 'ade20k_nala-t-linear_upernet.py')),
    'nala_t_hybrid': dict(label='UperNet + NaLaFormer-T (hybrid)',
                          config=osp.join(REPO, 'configs', 'ade20k_nala_upernet.py')),
}
SHORTHANDS = {NormAwareLinearAttention: 'nala', LinearAttention: 'linear',
              SoftmaxAttention: 'softmax'}


def stage_mixers(backbone: torch.nn.Module) -> List[str]:
    """Each stage's mixer as its shorthand (``'nala'``, ``'linear'``, ``'softmax'``; else the
    class name), read from the built modules."""
    stages: Dict[int, str] = {}
    for name, layer in attention_layers(backbone).items():
        stages.setdefault(backbone.stage_of(name),
                          SHORTHANDS.get(type(layer), type(layer).__name__))
    return [stages[i] for i in sorted(stages)]


def timing_summary(times: Dict[str, List[float]]) -> dict:
    ratios = [o / e for o, e in zip(times['onnxruntime'], times['eager'])]
    summary = {f'{name}_{stat}_ms': fn(values) for name, values in times.items()
               for stat, fn in (('median', median), ('min', min))}
    return dict(summary, ratio_ort_over_eager=median(ratios), rounds=len(ratios), times_ms=times)


def export_dynamic(module, side: int, path: str) -> float:
    """One graph for every size (``--dynamic``), exported at ``side``; the seconds it took."""
    start = time.perf_counter()
    export(module, torch.randn(1, 3, side, side), path, ['seg_logits'], dynamic=True)
    return time.perf_counter() - start


def measure_onnx(module, session, side: int, repeats: int) -> dict:
    """Parity and ONNX Runtime vs eager times, in turns, at ``side``."""
    image = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(side))
    feed = {'input': image.numpy()}
    with torch.no_grad():
        expected = module(image).numpy()
    error = relative_l2(session.run(['seg_logits'], feed)[0], expected)

    def eager():
        with torch.no_grad():
            module(image)

    times = interleaved_ms(dict(eager=eager, onnxruntime=lambda: session.run(None, feed)),
                           repeats)
    return dict(side=side, rel_l2=error, **timing_summary(times))


def report_lines(result: dict) -> List[str]:
    """The markdown page of a run."""
    load = ', '.join(f'{a:.1f} -> {b:.1f}' for a, b in zip(result['load_average_start'],
                                                          result['load_average_end']))
    lines = [f'# Deployment benchmark: ONNX Runtime vs PyTorch eager ({result["device"]})', '',
             f'torch {result["torch"]}, onnxruntime {result["onnxruntime"]}, onnx '
             f'{result["onnx"]}; batch 1; input (1, 3, H, W) -> logits at input resolution: '
             f'one graph per model from `tools/export_onnx.py --dynamic` (opset '
             f'{result["opset"]}), exported at {result["sides"][0]}² and run at every size. '
             'Engines timed in turns after one warm-up round; ORT / eager = median of the '
             'per-round ratios. Random weights (timing does not depend on them). Load average '
             f'(1, 5, 15 min) at start -> end: {load} on this shared machine.', '']
    lines += report.markdown_table(
        ['model', 'kernel', 'side', 'rel. L2 error', 'PyTorch eager ms (median / min)',
         'ONNX Runtime ms (median / min)', 'ORT / eager', 'rounds'],
        [[model['label'], model['kernel'], row['side'], f"{row['rel_l2']:.1e}",
          f"{row['eager_median_ms']:.0f} / {row['eager_min_ms']:.0f}",
          f"{row['onnxruntime_median_ms']:.0f} / {row['onnxruntime_min_ms']:.0f}",
          f"{row['ratio_ort_over_eager']:.2f}", row['rounds']]
         for model in result['models'].values() for row in model['onnx']])
    lines += ['', 'Export time (dynamic H, W): ' + ', '.join(
        f'{m["label"]} {m["export_s"]:.0f} s' for m in result['models'].values()) + '.']
    return lines


def plot(result: dict, path: str) -> None:
    plt = report.pyplot()
    groups = [(model['label'].split('(')[-1].rstrip(')'), row)
              for model in result['models'].values() for row in model['onnx']]
    x = np.arange(len(groups))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for offset, (key, label) in zip((-0.2, 0.2), (('eager', 'PyTorch eager'),
                                                  ('onnxruntime', 'ONNX Runtime'))):
        medians = [row[f'{key}_median_ms'] / 1e3 for _, row in groups]
        spread = [[m - row[f'{key}_min_ms'] / 1e3 for m, (_, row) in zip(medians, groups)],
                  [max(row['times_ms'][key]) / 1e3 - m for m, (_, row) in zip(medians, groups)]]
        ax.bar(x + offset, medians, 0.4, yerr=spread, capsize=3, label=label)
    ax.set_xticks(x, [f'{name}\n{row["side"]}²' for name, row in groups])
    ax.set_ylabel('seconds per image (median; min-max)')
    ax.set_yscale('log')
    ax.set_title(f'UperNet + NaLaFormer-T inference, {result["device"]}')
    ax.grid(True, axis='y', which='both', alpha=0.3)
    ax.legend()
    report.save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--sides', nargs='+', type=int, default=[512, 1024])
    parser.add_argument('--repeats', nargs='+', type=int, default=[5, 3],
                        help='timed rounds per side (one number for all, or one per side)')
    parser.add_argument('--models', nargs='+', choices=list(MODELS), default=list(MODELS))
    parser.add_argument('--out', default=SPEED_RESULTS, help='output folder')
    report.add_report_only_argument(parser, 'deploy')
    args = parser.parse_args()
    stem = osp.join(args.out, 'deploy')
    if args.report_only:
        write_outputs(report.read_json(stem + '.json'), stem)
        return
    repeats = args.repeats if len(args.repeats) == len(args.sides) else \
        [args.repeats[0]] * len(args.sides)
    import onnx
    import onnxruntime
    result = dict(device=f'CPU, {torch.get_num_threads()} threads', torch=torch.__version__,
                  onnx=onnx.__version__, onnxruntime=onnxruntime.__version__, opset=DEFAULT_OPSET,
                  sides=args.sides, repeats=repeats, load_average_start=os.getloadavg(),
                  models={})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        for name in args.models:
            spec = MODELS[name]
            torch.manual_seed(0)
            module, _ = build_exportable(spec['config'])
            backbone = module.segmentor.backbone
            kernel = next(m.cfg.kernel for m in backbone.modules()
                          if isinstance(m, NormAwareLinearAttention))
            entry = dict(label=spec['label'], config=osp.relpath(spec['config'], REPO),
                         kernel=kernel, attn_types=stage_mixers(backbone), onnx=[])
            path = osp.join(work, f'{name}.onnx')
            entry['export_s'] = export_dynamic(module, args.sides[0], path)
            session = ort_session(path)
            for side, rounds in zip(args.sides, repeats):
                entry['onnx'].append(measure_onnx(module, session, side, rounds))
                print(name, side, {k: v for k, v in entry['onnx'][-1].items() if k != 'times_ms'},
                      flush=True)
            del session
            os.remove(path)
            result['models'][name] = entry
    result['total_s'] = time.perf_counter() - start
    result['load_average_end'] = os.getloadavg()
    os.makedirs(args.out, exist_ok=True)
    write_outputs(result, stem)
    print(f'total {result["total_s"] / 60:.1f} min')


def write_outputs(result: dict, stem: str) -> None:
    """``stem.json`` (``result``), the page ``stem.md`` and the plot ``stem.png``."""
    report.write_json(stem + '.json', result)
    report.write_markdown(stem + '.md', report_lines(result))
    plot(result, stem + '.png')
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
