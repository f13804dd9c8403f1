"""Measurement helpers shared by the benchmark scripts: one case per process, peak memory
above the process's baseline, median time after warm-up."""
import json
import os
import subprocess
import sys
import time
from statistics import median
from typing import Callable, Dict, List

import torch


def _status_kib(field: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


def peak_memory_mib(step: Callable[[], None], device: str) -> float:
    """Peak memory of one ``step()`` above what was held before it.

    CPU: the resident-set high-water mark (VmHWM), reset through /proc/self/clear_refs; run
    the process with MALLOC_MMAP_THRESHOLD_ set (see :func:`spawn`) so freed blocks go back to
    the OS at once. GPU: the caching allocator's own peak counter.
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


def median_ms(step: Callable[[], None], repeats: int, device: str, warmup: int = 1) -> float:
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


def interleaved_ms(steps: Dict[str, Callable[[], None]], repeats: int,
                   warmup: int = 1) -> Dict[str, List[float]]:
    """Wall times (CPU) of several engines doing the same work, taken in turns.

    Each round times every engine once, so drift in a shared machine's load reaches all of them
    alike; compare per-round ratios or medians, not single calls.
    """
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: Dict[str, List[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start_s = time.perf_counter()
            step()
            times[name].append((time.perf_counter() - start_s) * 1e3)
    return times


def spawn(script: str, args: List[str], memory: bool, timeout: int = 3600) -> dict:
    """Run ``script --case *args`` in a fresh process; it prints one JSON line last."""
    env = dict(os.environ)
    if memory:
        env['MALLOC_MMAP_THRESHOLD_'] = '65536'  # large frees go back to the OS at once
    proc = subprocess.run([sys.executable, script, '--case', *args], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return dict(error=lines[-1] if lines else f'exit code {proc.returncode}')
    return json.loads(proc.stdout.strip().splitlines()[-1])
