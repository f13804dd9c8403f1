"""Whole-model inference speed and memory of a config on synthetic input (no dataset needed).

    python tools/benchmark.py CONFIG [--shape H W] [--batch B] [--warmup W] [--repeat N]
                              [--device cpu|cuda] [--amp] [--compile] [--out FILE.json]
                              [--compare CONFIG2]
                              [--cfg-options k=v ...]

The model is built from the config (random weights: no checkpoint is read, nothing downloaded,
SyncBN runs as BN) and runs ``model.test_step`` on ``--batch`` random images of ``--shape``:
the data preprocessor, the forward and the post-processing, as a test run does (a config's
``test_cfg``, e.g. sliding-window inference, applies). Detection post-processing depends on how
many boxes random weights leave, so detector latencies are indicative only.

* **Latency and images/s**: in a fresh process, ``--warmup`` untimed runs, then ``--repeat``
  timed ones (``torch.cuda.synchronize`` around each on CUDA); the median, the best and every
  time are reported; images/s = batch / median latency.
* **Memory**, in another fresh process per config: on CPU the peak resident set of that process
  (interpreter, libraries, model and the inference: what the machine must hold) and the
  inference's own peak above what the process held before it; on CUDA
  ``torch.cuda.max_memory_allocated`` over the runs and the inference's own peak.
* ``--compare CONFIG2`` builds both models in one process and times them in turns, so that a
  change in the machine's load reaches both alike; the ratio is the median of the per-round
  ratios (CONFIG2 over CONFIG).
* ``--amp``: autocast, fp16 on CUDA, bf16 on CPU (as ``tools/train.py --amp``).
* ``--compile``: the feature extraction through ``torch.compile`` (:mod:`nala_mm.apis.compile`); the
  first call, which compiles, is timed apart (``compile_seconds``) before the warm-up runs.

``--out`` writes JSON: per model ``latency_ms`` (median, best, all), ``fps`` and ``memory_mib``;
with ``--compare`` also ``compare`` (``latency_ratio``, ``fps_ratio``, ``memory_ratio``). It
records the package version, the device and the memory available when the run started.
"""
import argparse
import json
import os
import os.path as osp
import sys
import time
from typing import Callable, Optional, Tuple

import torch

import nala_mm
from nala_mm import compat
from nala_mm.analysis.measure import (
    add_case_argument,
    available_mib,
    device_name,
    in_turns,
    peak_memory_mib,
    print_case_result,
    run_case,
)

compat.install()


def positive(kind: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f'{kind} takes an integer, got {text!r}') from None
        if value < (0 if kind == '--warmup' else 1):
            bound = 'zero or more' if kind == '--warmup' else 'at least 1'
            raise argparse.ArgumentTypeError(f'{kind} must be {bound}, got {value}')
        return value
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Inference latency, images/s and peak memory of a config on synthetic input')
    parser.add_argument('config', nargs='?', help='config file (or mmseg::/mmdet:: path)')
    parser.add_argument('--shape', nargs=2, type=positive('--shape'), default=[512, 512],
                        metavar=('H', 'W'), help='input height and width (default 512 512)')
    parser.add_argument('--batch', type=positive('--batch'), default=1,
                        help='images per forward (default 1)')
    parser.add_argument('--warmup', type=positive('--warmup'), default=2,
                        help='untimed runs before timing (default 2)')
    parser.add_argument('--repeat', type=positive('--repeat'), default=10,
                        help='timed runs (default 10)')
    parser.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    parser.add_argument('--amp', action='store_true',
                        help='autocast: fp16 on CUDA, bf16 on CPU')
    parser.add_argument('--compile', action='store_true',
                        help='torch.compile the feature extraction; compile time is reported')
    parser.add_argument('--compare', metavar='CONFIG2',
                        help='a second config, timed in turns with CONFIG; prints the ratio')
    parser.add_argument('--out', metavar='FILE.json', help='write the results as JSON')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='override settings of both configs, e.g. model.test_cfg.mode=whole')
    add_case_argument(parser)
    args = parser.parse_args(argv)
    if args.case is None:
        if args.config is None:
            parser.error('the following arguments are required: config')
        for path in filter(None, (args.config, args.compare)):
            if '::' not in path and not osp.isfile(path):
                parser.error(f'config {path!r} does not exist')
        if args.device == 'cuda' and not torch.cuda.is_available():
            parser.error(f'--device cuda, but torch {torch.__version__} sees no CUDA device '
                         '(a CPU build of torch, or no GPU visible)')
    return args


# ------------------------------------------------------------------------------ one case
def inference_step(config: str, case: dict) -> Tuple[Callable[[], object], Optional[float]]:
    """The model of ``config`` on ``case['device']`` and one ``test_step`` on the synthetic batch,
    as a callable; and with ``case['compile']`` the seconds of the first, compiling call."""
    from nala_mm.apis.config_loading import build_model_from_config
    from nala_mm.apis.data_samples import synthetic_batch
    device = case['device']
    model, scope = build_model_from_config(config, case.get('cfg_options') or None)
    model = model.to(device)
    data = synthetic_batch(scope, case['batch'], *case['shape'])
    amp_dtype = torch.float16 if device == 'cuda' else torch.bfloat16

    def step():
        with torch.no_grad(), torch.autocast(device, dtype=amp_dtype, enabled=case['amp']):
            return model.test_step(data)
    if not case.get('compile'):
        return step, None
    from nala_mm.apis.compile import compile_feature_extraction
    compile_feature_extraction(model)
    start = time.perf_counter()
    step()
    if device == 'cuda':
        torch.cuda.synchronize()
    return step, time.perf_counter() - start


def run_one_case(case: dict) -> dict:
    """What a child process measures: ``time`` (every config of the case, in turns) or
    ``memory`` (its one config)."""
    device = case['device']
    # keyed by position: --compare may time a config against itself (a noise check)
    built = {str(i): inference_step(config, case) for i, config in enumerate(case['configs'])}
    steps = {key: step for key, (step, _) in built.items()}
    if case['what'] == 'time':
        return dict(times=in_turns(steps, reference='0', repeats=case['repeat'],
                                   warmup=case['warmup'], device=device),
                    compile_seconds={key: seconds for key, (_, seconds) in built.items()})
    (step,) = steps.values()
    for _ in range(max(1, case['warmup'])):  # the peak RSS includes one whole inference
        step()
    if device == 'cuda':
        torch.cuda.synchronize()
        total = dict(max_allocated=torch.cuda.max_memory_allocated() / 2 ** 20)
    else:
        with open('/proc/self/status') as f:
            status = dict(line.split(':', 1) for line in f)
        total = dict(peak_rss=int(status['VmHWM'].split()[0]) / 1024)
    return dict(memory=dict(total, inference_peak=peak_memory_mib(step, device)))


# ------------------------------------------------------------------------------ the parent
def measure(args: argparse.Namespace) -> dict:
    configs = [args.config] + ([args.compare] if args.compare else [])
    base = dict(shape=list(args.shape), batch=args.batch, warmup=args.warmup, repeat=args.repeat,
                device=args.device, amp=args.amp, compile=args.compile,
                cfg_options=dict(args.cfg_options))
    env = {'PYTHONWARNINGS': os.environ.get('PYTHONWARNINGS', 'ignore')}
    script = osp.abspath(__file__)
    result = dict(tool='tools/benchmark.py', code=f'nala-mm {nala_mm.__version__}',
                  device_type=args.device,
                  device=device_name(args.device),
                  torch=torch.__version__, available_mib_at_start=round(available_mib(args.device)),
                  **{k: v for k, v in base.items() if k not in ('cfg_options', 'device')},
                  cfg_options=base['cfg_options'], models=[])
    timed = run_case(script, dict(base, configs=configs, what='time'), env=env)
    if 'error' in timed:
        raise RuntimeError(f'timing failed: {timed["error"]}')
    for index, config in enumerate(configs):
        times = timed['times'][str(index)]
        memory = run_case(script, dict(base, configs=[config], what='memory'), memory=True,
                          env=env)
        if 'error' in memory:
            raise RuntimeError(f'memory of {config} failed: {memory["error"]} '
                               f'({result["available_mib_at_start"]} MiB were available)')
        result['models'].append(dict(
            config=config,
            latency_ms=dict(median=times['median_ms'], best=times['best_ms'],
                            all=times['times_ms']),
            fps=args.batch * 1000 / times['median_ms'],
            compile_seconds=timed['compile_seconds'][str(index)],
            memory_mib={k: round(v, 1) for k, v in memory['memory'].items()},
            latency_ratio_to_first=times.get('ms_ratio')))
    if args.compare:
        first, second = result['models']
        key = 'max_allocated' if args.device == 'cuda' else 'peak_rss'
        result['compare'] = dict(
            latency_ratio=second['latency_ratio_to_first'],
            fps_ratio=second['fps'] / first['fps'],
            memory_ratio=second['memory_mib'][key] / first['memory_mib'][key],
            inference_memory_ratio=second['memory_mib']['inference_peak'] /
            max(first['memory_mib']['inference_peak'], 1e-9))
    for model in result['models']:
        model.pop('latency_ratio_to_first')
    return result


def report(result: dict) -> str:
    total = 'max allocated' if result['device_type'] == 'cuda' else 'peak RSS'
    lines = [f"{result['device']}, torch {result['torch']}, {result['code']}; batch "
             f"{result['batch']} at {result['shape'][0]}x{result['shape'][1]}, "
             f"{result['repeat']} timed runs after {result['warmup']} warm-up"
             f"{', autocast' if result['amp'] else ''}"
             f"{', compiled' if result.get('compile') else ''}",
             f"{'config':<56} {'median ms':>10} {'best ms':>9} {'images/s':>9} "
             f"{total + ' MiB':>18} {'inference MiB':>14}"]
    for model in result['models']:
        memory = model['memory_mib']
        lines.append(f"{model['config'][-56:]:<56} {model['latency_ms']['median']:>10.1f} "
                     f"{model['latency_ms']['best']:>9.1f} {model['fps']:>9.2f} "
                     f"{memory.get('peak_rss', memory.get('max_allocated')):>18.1f} "
                     f"{memory['inference_peak']:>14.1f}")
    for model in result['models']:
        if model.get('compile_seconds') is not None:
            lines.append(f"{model['config'][-56:]}: compiled in {model['compile_seconds']:.1f} s "
                         '(the first call)')
    if 'compare' in result:
        c = result['compare']
        lines.append(f"second / first: {c['latency_ratio']:.2f} of the time (median of per-round "
                     f"ratios, timed in turns), {c['fps_ratio']:.2f}x the images/s, "
                     f"{c['memory_ratio']:.2f} of the {total}, {c['inference_memory_ratio']:.2f} "
                     'of the inference peak')
    return '\n'.join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.case is not None:
        print_case_result(run_one_case(args.case))
        return
    try:
        result = measure(args)
    except RuntimeError as error:
        print(f'error: {error}', file=sys.stderr)
        sys.exit(1)
    print(report(result))
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)
        print(f'written: {args.out}')


if __name__ == '__main__':
    main()
