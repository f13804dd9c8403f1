"""The harness every speed benchmark runs on: a grid of cases, each measured in fresh processes.

A *case* is a dict of settings (a mode, a size, ...) and the models compared in it. For each
case :func:`run_grid` takes every model's peak memory in a process of its own (a high-water
mark only rises, and one model's allocator state must not reach the next), then times the
models that ran in turns in one more process, so that their time ratios compare calls made
under the same load (:func:`nala_mm.analysis.measure.in_turns`). An optional predictor looks at
the rows measured so far and may skip a model (its reason is recorded in the row) or ask for a
single timed call where rounds would take too long: then every model of the case is timed in
one round, and a case of one model is timed by the call its memory process makes.

The benchmark's own module is the child: started as ``python -m MODULE --case JSON``, it answers
with :func:`grid_case` and a ``make_step(model, case)`` that returns one call to measure. A step
that carries a ``setup_s`` attribute (seconds ``make_step`` spent on its first call, e.g.
compiling it) has it recorded in its row, from the memory process (the first to build it), and
as ``warm_setup_s`` from the timing process (built again, with the caches the first left).

    rows = run_grid(__spec__.name, cases, repeats=3, warmup=1, device='cpu')
"""
import argparse
import os
import os.path as osp
import resource
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from nala_mm.analysis.measure import (
    Step,
    add_case_argument,
    in_turns,
    median_ms,
    peak_memory_mib,
    print_case_result,
    run_case,
)

from . import report
from .paths import REPO, SPEED_RESULTS

Case = Tuple[Dict[str, Any], Sequence[str]]  # (settings shared by the models, the models)
MakeStep = Callable[[str, dict], Step]
# (rows measured so far, model, settings) -> fields for the row: 'skipped' (a reason) skips the
# model, 'calls': 1 times one call instead of rounds; anything else (predictions) is recorded
Predict = Callable[[List[dict], str, Dict[str, Any]], dict]


def run_grid(module: str, cases: Sequence[Case], *, repeats: int, warmup: int, device: str,
             reference: Optional[str] = None, predict: Optional[Predict] = None,
             memory: bool = True, timeout: int = 3600, limit_mib: Optional[float] = None,
             describe: Optional[Callable[[str, dict], dict]] = None,
             after_case: Optional[Callable[[List[dict]], None]] = None,
             desc: str = 'cases') -> List[dict]:
    """Measure every case; one row per (case, model): ``model``, the case's settings,
    ``describe(model, settings)``'s fields, the prediction's, then ``mib`` (peak memory above
    the baseline, MiB), ``ms`` / ``ms_best`` / ``times_ms`` (median, best and every round's
    time), ``ms_ratio`` (median of the per-round ratios to ``reference``), or ``error``.

    Args:
        module: the benchmark's module (``benchmarks.speed.vit``), started as the child.
        cases: ``(settings, models)`` pairs, in order (a predictor sees earlier rows).
        repeats, warmup: timed rounds in turns, and untimed rounds before them (a memory
            process runs ``warmup`` steps, at most one, before it measures).
        memory: take peak memory (False: time only).
        limit_mib: an address-space limit for each CPU child: an allocation past it fails in
            the child instead of waking the out-of-memory killer.
        after_case: called with all rows so far after each case (to save partial results).
    """
    from tqdm import tqdm
    env = {'PYTHONPATH': REPO + os.pathsep + os.environ.get('PYTHONPATH', '')}
    rows: List[dict] = []
    progress = tqdm(cases, desc=desc)
    for settings, models in progress:
        progress.set_postfix_str(' '.join(f'{v}' for v in settings.values()))
        child = dict(settings, repeats=repeats, warmup=warmup, device=device,
                     reference=reference, limit_mib=limit_mib)
        mine = []
        for name in models:
            row = dict(model=name, **settings, **(describe(name, settings) if describe else {}))
            if predict is not None:
                row.update(predict(rows, name, settings))
            if 'skipped' not in row and memory:
                single = row.get('calls') == 1
                result = run_case(module, dict(child, models=[name], what='memory',
                                               warmup=0 if single else min(warmup, 1),
                                               single_call=single and len(models) == 1),
                                  memory=True, timeout=timeout, env=env)
                row['mib'] = result.pop('peak_mib', None)
                row.update(result)  # an error, or what the child adds (a single call's ms)
            progress.write(f"{name} {settings}: {row.get('skipped') or row.get('error') or ''}"
                           + (f"{row['mib']:.0f} MiB" if row.get('mib') is not None else ''))
            mine.append(row)
        # timed in turns: what ran (a single call already timed in its memory process is not)
        timed = [r for r in mine if 'skipped' not in r and 'error' not in r and 'ms' not in r]
        single = any(r.get('calls') == 1 for r in timed)
        timing = run_case(module, dict(child, models=[r['model'] for r in timed], what='turns',
                                       repeats=1 if single else repeats,
                                       warmup=0 if single else warmup),
                          timeout=timeout * len(timed), env=env) if timed else {}
        for row in timed:
            result = timing.get(row['model'], {})
            row.update(ms=result.get('median_ms'), ms_best=result.get('best_ms'),
                       ms_ratio=result.get('ms_ratio'), times_ms=result.get('times_ms'))
            if 'setup_s' in result:  # the first call again, in a second process: warm caches
                row['warm_setup_s'] = result['setup_s']
            if 'error' in timing:
                row['error'] = timing['error']
        for row in mine:  # every row has the time fields (None where nothing was timed)
            for key in ('ms', 'ms_best', 'ms_ratio', 'times_ms'):
                row.setdefault(key, None)
        rows += mine
        if after_case is not None:
            after_case(rows)
    return rows


def grid_case(case: dict, make_step: MakeStep) -> dict:
    """The child's answer to :func:`run_grid`: one model's peak memory (``what='memory'``;
    with ``single_call`` that call's time too), or the models timed in turns."""
    device = case['device']
    if device == 'cpu' and case.get('limit_mib'):
        limit = int(case['limit_mib'] * 2 ** 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    torch.manual_seed(0)
    steps = {name: make_step(name, case) for name in case['models']}
    if case['what'] == 'memory':
        step, = steps.values()
        for _ in range(case['warmup']):
            step()
        start = time.perf_counter()
        peak = peak_memory_mib(step, device)
        single = dict(ms=(time.perf_counter() - start) * 1e3) if case.get('single_call') else {}
        setup = {'setup_s': step.setup_s} if hasattr(step, 'setup_s') else {}
        return dict(peak_mib=peak, **single, **setup)
    if case['repeats'] == 1 and case['warmup'] == 0:  # too long for rounds: one call each
        calls = {name: median_ms(step, 1, device, warmup=0) for name, step in steps.items()}
        result = {name: dict(median_ms=ms, best_ms=ms, times_ms=[ms])
                  for name, ms in calls.items()}
    else:
        result = in_turns(steps, case.get('reference'), case['repeats'], case['warmup'], device)
    for name, step in steps.items():
        if hasattr(step, 'setup_s'):
            result[name]['setup_s'] = step.setup_s
    return result


def grid_cli(doc: str, name: str, make_step: MakeStep,
             write_page: Callable[[dict, str], None],
             arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None,
             devices: bool = True) -> Optional[Tuple[argparse.Namespace, str]]:
    """The command line a speed benchmark's ``main`` starts with: its own ``arguments``, then
    ``--device`` (with ``devices``), ``--out``, ``--report-only`` and the grid's ``--case``.

    As the grid's child it answers the case (:func:`grid_case` with ``make_step``); with
    ``--report-only`` it writes the page and plot again from the JSON (``write_page(saved,
    stem)``) and shows the page. Both return ``None``. Otherwise: the arguments and the results
    stem, ``OUT/NAME`` (``OUT/NAME_DEVICE`` off the CPU), for the benchmark to measure into.
    """
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments(parser)
    if devices:
        parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=SPEED_RESULTS, help='output folder')
    report.add_report_only_argument(parser, name)
    add_case_argument(parser)
    args = parser.parse_args()
    if args.case is not None:
        print_case_result(grid_case(args.case, make_step))
        return None
    device = getattr(args, 'device', 'cpu')
    stem = osp.join(args.out, name if device == 'cpu' else f'{name}_{device}')
    if args.report_only:
        write_page(report.read_json(stem + '.json'), stem)
        print(open(stem + '.md').read())
        return None
    return args, stem


def per_round_ratio(row: dict, other: dict) -> Optional[float]:
    """``row``'s time over ``other``'s as the median of their per-round ratios (both timed in
    the same rounds of one process), or None."""
    mine, theirs = row.get('times_ms'), other.get('times_ms')
    if not mine or not theirs or len(mine) != len(theirs):
        return None
    ratios = sorted(a / b for a, b in zip(mine, theirs))
    middle = len(ratios) // 2
    return ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
