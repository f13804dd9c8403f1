"""Measuring a callable: its peak memory above a baseline, its median time, several callables
timed in turns, and the one protocol by which a measurement runs in a fresh process.

A peak memory needs a process of its own (a high-water mark only rises), and a process that
measured one model must not hand its allocator's state to the next. :func:`run_case` starts
``python SCRIPT --case '<JSON object>'`` (``python -m MODULE ...`` for a module); the script adds
the argument with :func:`add_case_argument`, measures, and ends with :func:`print_case_result`
(one JSON line, the last of its stdout).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from statistics import median
from typing import Callable, Dict, List, Optional

import torch

Step = Callable[[], object]
# glibc returns freed blocks of at least this many bytes to the OS at once, so the resident set
# falls after a step and the next step's high-water mark is its own
MALLOC_MMAP_THRESHOLD = '65536'


def _status_kib(field: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


def peak_memory_mib(step: Step, device: str) -> float:
    """Peak memory of one ``step()`` above what was held before it.

    CPU: the resident-set high-water mark (VmHWM), reset through /proc/self/clear_refs; run the
    process through :func:`run_case` with ``memory=True`` so freed blocks go back to the OS at
    once. GPU: the caching allocator's own peak counter.
    """
    if device == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # resets VmHWM to the current RSS
    base = _status_kib('VmRSS')
    step()
    return (_status_kib('VmHWM') - base) / 1024


def median_ms(step: Step, repeats: int, device: str = 'cpu', warmup: int = 1) -> float:
    """Median time of ``repeats`` calls after ``warmup`` untimed ones (CUDA events on a GPU)."""
    for _ in range(warmup):
        step()
    times: List[float] = []
    for _ in range(repeats):
        if device == 'cuda':
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            step()
            times.append((time.perf_counter() - start_s) * 1e3)
    return median(times)


def interleaved_ms(steps: Dict[str, Step], repeats: int, warmup: int = 1,
                   device: str = 'cpu') -> Dict[str, List[float]]:
    """Wall times of several engines doing the same work, taken in turns.

    Each round times every engine once, so drift in a shared machine's load reaches all of them
    alike; compare per-round ratios or medians, not single calls.
    """
    def sync() -> None:
        if device == 'cuda':
            torch.cuda.synchronize()

    for _ in range(warmup):
        for step in steps.values():
            step()
    times: Dict[str, List[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            sync()
            start_s = time.perf_counter()
            step()
            sync()
            times[name].append((time.perf_counter() - start_s) * 1e3)
    return times


def in_turns(steps: Dict[str, Step], reference: str, repeats: int, warmup: int,
             device: str) -> Dict[str, dict]:
    """Every step's median and best time from rounds taken in turns in one process, and its
    time ratio to ``reference`` as the median of the per-round ratios (robust to load drift:
    both calls of a round see the same machine)."""
    times = interleaved_ms(steps, repeats, warmup, device)
    result = {}
    for name, mine in times.items():
        result[name] = dict(median_ms=median(mine), best_ms=min(mine), times_ms=mine)
        if reference in times:
            result[name]['ms_ratio'] = median(a / b for a, b in zip(mine, times[reference]))
    return result


def measure(step: Step, what: str, repeats: int, warmup: int, device: str) -> dict:
    """Peak memory of one ``step`` (``what='memory'``) or its median time, after ``warmup``
    steps (so one-time allocations such as kernel caches and gradient buffers are part of the
    baseline)."""
    if what == 'memory':
        for _ in range(warmup):
            step()
        return dict(peak_mib=peak_memory_mib(step, device))
    return dict(median_ms=median_ms(step, repeats, device, warmup=warmup), repeats=repeats)


def available_mib(device: str) -> float:
    """Memory free now: the GPU's, or this machine's (``MemAvailable``: what can be allocated
    without swapping or the out-of-memory killer)."""
    if device == 'cuda':
        return torch.cuda.mem_get_info()[0] / 2 ** 20
    with open('/proc/meminfo') as f:
        info = dict(line.split(':', 1) for line in f)
    return int(info['MemAvailable'].split()[0]) / 1024


def device_name(device: str) -> str:
    """The GPU's name, or the CPU with the number of intra-op threads torch uses."""
    if device == 'cuda':
        return torch.cuda.get_device_name()
    threads = torch.get_num_threads()
    return f'CPU, {threads} thread{"s" if threads > 1 else ""}'


# ------------------------------------------------------------------------------ one case a process
def error_of(proc: subprocess.CompletedProcess) -> str:
    """What a failed process said last: its last line of stderr, or its exit code."""
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f'exit code {proc.returncode}'


def run_case(script: str, case: dict, memory: bool = False, timeout: int = 3600,
             env: Optional[Dict[str, str]] = None) -> dict:
    """Run ``python script --case '<case as JSON>'`` in a fresh process (``python -m script``
    when ``script`` names a module rather than a ``.py`` file) and return the JSON object it
    printed last, or ``dict(error=...)``: the last line of its stderr, or the timeout.

    ``memory``: the process measures peak memory (see :data:`MALLOC_MMAP_THRESHOLD`); ``env``:
    variables added to this process's environment.
    """
    child_env = dict(os.environ, **(env or {}))
    if memory:
        child_env['MALLOC_MMAP_THRESHOLD_'] = MALLOC_MMAP_THRESHOLD
    try:
        command = [sys.executable] + ([script] if script.endswith('.py') else ['-m', script])
        proc = subprocess.run(command + ['--case', json.dumps(case)],
                              capture_output=True, text=True, env=child_env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f'timeout after {timeout} s')
    if proc.returncode != 0:
        return dict(error=error_of(proc))
    lines = proc.stdout.strip().splitlines()
    if not lines:
        return dict(error='the case printed no result')
    return json.loads(lines[-1])


def parse_case(text: str) -> dict:
    """``--case``'s value: a JSON object."""
    try:
        case = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f'--case takes a JSON object: {error}') from error
    if not isinstance(case, dict):
        raise argparse.ArgumentTypeError(f'--case takes a JSON object, got {text!r}')
    return case


def add_case_argument(parser: argparse.ArgumentParser) -> None:
    """The hidden ``--case JSON`` of a script that :func:`run_case` starts (``None`` when the
    script runs as the parent)."""
    parser.add_argument('--case', type=parse_case, help=argparse.SUPPRESS)


def print_case_result(result: dict) -> None:
    """A case's answer to :func:`run_case`: one JSON line, printed last."""
    print(json.dumps(result), flush=True)
