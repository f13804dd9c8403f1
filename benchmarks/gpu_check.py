"""The GPU check: one prepared script for a GPU machine without network, about five minutes.

    python3 -m benchmarks.gpu_check --out DIR                      # on the GPU machine
    python3 -m benchmarks.gpu_check --out DIR --device cpu --tiny  # the rehearsal, on a CPU

(from the repository root, as every benchmark runs.)
It runs on the machine's own torch (a CUDA build with Triton). What that machine lacks travels
as wheels in ``.gpu_wheels/carry`` (``make gpu-wheels``; requirements/gpu_carry.txt): the
pure-Python mmengine, mmseg and mmdet, ``mmcv-lite`` (mmcv 2.1.0 without compiled ops) and their
small needs. The script installs them with ``pip install --no-index --no-deps --target`` into a
temporary folder, writes a stand-in for mmcv's compiled module (``mmcv/_ext.py``, whose every
attribute is a function that raises "compiled op unavailable": ``mmcv.ops`` loads it on import,
and ``mmseg.models`` and ``mmdet.models`` import ``mmcv.ops``), and runs again with that folder
first on its path. The machine's numpy (2.5) is used as it is, newer than setup.py's pin.

**Left out**, since each needs mmcv's compiled ops: NMS and RoIAlign (RPN, RetinaNet, Mask
R-CNN, the ``mask-rcnn`` part of the ViTDet benchmark), ``tools/check_env.py``, focal loss,
point-sample heads.

**Stages**, each in a process of its own with its own time budget (seconds, ``--budget``
scales them), each writing its file after every measurement, so that a run cut short returns
what it measured; every file names the card and the torch version:

1. ``attention.json``: the kernelised attention against SDPA (FlashAttention on a GPU) at
   ViT-B's shape (12 heads x 64, batch 1), forward + backward under bf16 autocast (NaLa's math
   in float32, as the mixers run it), at 4K, 16K and 64K tokens: NaLa eager (the custom ops),
   NaLa compiled (the custom ops as nodes), NaLa's reference formula compiled (inductor fuses
   it), SDPA eager and compiled; the token count where NaLa overtakes SDPA;
2. ``cuda_tests.json``: the ``-m cuda`` tests (``make test-cuda``), each test's outcome;
3. ``backbones.json``: NaLaFormer-T (all NaLa; the released hybrid), Swin-T, and the NaLa and
   SDPA ViT-B, eager, a training step at 1024² in float32 and under bf16 autocast;
4. ``compiled_training.json``: NaLaFormer-T against Swin-T, compiled (inductor, regionally: each
   block class once, which fits the budget where whole-model compilation may not), a training
   step at 1024² under bf16 autocast, with compile time (the first call).

``summary.md`` and ``gpu_check.log`` (every stage's output) complete the at most 8 files.
"""
import argparse
import glob
import json
import math
import os
import os.path as osp
import re
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
STAGES = {'attention': 70, 'cuda_tests': 80, 'backbones': 40, 'compiled_training': 100}
EXT_STUB = '''"""Stand-in for mmcv's compiled ops, written by benchmarks/gpu_check.py (mmcv-lite
has none). Every attribute is a function that raises, so that ``mmcv.ops`` imports (it loads
this module on import) and a model that calls a compiled op stops with a clear error."""


def __getattr__(name):
    if name.startswith('__'):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise RuntimeError(f'mmcv compiled op {name!r} unavailable: mmcv-lite has no compiled '
                           'ops (benchmarks/gpu_check.py leaves out what needs them)')
    return unavailable
'''


# ------------------------------------------------------------------------------ set-up
def bootstrap(wheels: str) -> None:
    """Re-run this script with the carried wheels installed, unless mmseg imports already."""
    try:
        import mmdet  # noqa: F401
        import mmseg  # noqa: F401
        return
    except ImportError:
        pass
    found = sorted(glob.glob(osp.join(wheels, '*.whl')))
    if not found:
        raise SystemExit(f'gpu_check: mmseg and mmdet are not installed and {wheels} holds no '
                         'wheels: run `make gpu-wheels` where pip reaches PyPI and carry '
                         f'{osp.relpath(wheels, REPO)}')
    site = tempfile.mkdtemp(prefix='nala-gpu-check-site-')
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps',
                    '--no-compile', '--target', site, *found], check=True)
    with open(osp.join(site, 'mmcv', '_ext.py'), 'w') as f:
        f.write(EXT_STUB)
    path = os.pathsep.join([site, os.environ.get('PYTHONPATH', '')]).rstrip(os.pathsep)
    os.execve(sys.executable, [sys.executable, '-m', __spec__.name, *sys.argv[1:]],
              dict(os.environ, PYTHONPATH=path))


def environment(device: str) -> dict:
    import numpy
    import torch
    info = dict(torch=torch.__version__, cuda=torch.version.cuda, numpy=numpy.__version__,
                python=sys.version.split()[0], device=device)
    info['card'] = torch.cuda.get_device_name() if device == 'cuda' else 'CPU (rehearsal)'
    for name in ('triton', 'mmengine', 'mmcv', 'mmseg', 'mmdet'):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    info['left_out'] = ('NMS and RoIAlign (RPN, RetinaNet, Mask R-CNN, ViTDet mask-rcnn), '
                        'tools/check_env.py, focal loss, point-sample heads: mmcv compiled ops')
    return info


class Results:
    """A stage's file, written again after every measurement."""

    def __init__(self, out: str, stage: str, device: str):
        self.path = osp.join(out, f'{stage}.json')
        self.data = dict(stage=stage, **environment(device), rows=[], done=False)
        self.write()

    def add(self, **row) -> None:
        self.data['rows'].append(row)
        print(json.dumps(row), flush=True)
        self.write()

    def write(self) -> None:
        with open(self.path, 'w') as f:
            json.dump(self.data, f, indent=1)


# ------------------------------------------------------------------------------ measuring
def timed(step: Callable[[], None], device: str, repeats: int, warmup: int) -> dict:
    """Median milliseconds of ``step`` and its peak memory above what was held (GPU only)."""
    import torch
    sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
    start = time.perf_counter()
    step()  # the first call: compiles, where the step is compiled
    sync()
    first_s = time.perf_counter() - start
    for _ in range(warmup):
        step()
    peak = None
    if device == 'cuda':
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    if device == 'cuda':
        peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    return dict(ms=sorted(times)[len(times) // 2], peak_mib=peak, first_call_s=first_s)


def guarded(results: Results, what: dict, run: Callable[[], dict]) -> None:
    """One measurement: its numbers, or the error that stopped it (the stage goes on)."""
    try:
        results.add(**what, **run())
    except Exception as error:  # noqa: BLE001  (reported, not hidden: the row says what failed)
        results.add(**what, error=f'{type(error).__name__}: {str(error)[:300]}')
    finally:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ stages
def stage_attention(args, results: Results) -> None:
    import torch
    import torch.nn.functional as F

    from nala_mm.ops import NaLaConfig, nala_attention, rope_table
    heads, dims = 12, 64
    sides = (8, 16) if args.tiny else (64, 128, 256)  # 4K, 16K, 64K tokens
    cfg = NaLaConfig()

    def nala(mode):
        def attend(q, k, v, cos, sin):
            with torch.autocast(args.device, enabled=False):  # as the mixers run it
                out = nala_attention(q.float(), k.float(), v.float(), cfg, (cos, sin), mode=mode)
            return out.to(q.dtype)
        return attend

    def sdpa(q, k, v, cos, sin):
        return F.scaled_dot_product_attention(q, k, v)

    engines = {'nala@eager': (nala('fast'), False), 'nala@compiled': (nala('fast'), True),
               'nala-reference@compiled': (nala('reference'), True), 'sdpa@eager': (sdpa, False),
               'sdpa@compiled': (sdpa, True)}
    for side in sides:
        n_tokens = side * side
        cos, sin = (t.to(args.device) for t in rope_table(side, side, dims))
        for name, (fn, compile_it) in engines.items():
            def run(fn=fn, compile_it=compile_it):
                torch._dynamo.reset()
                call = torch.compile(fn, dynamic=False) if compile_it else fn
                q, k, v = (torch.randn(1, heads, n_tokens, dims, device=args.device,
                                       dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                grad = torch.randn_like(q)

                def step():
                    with torch.autocast(args.device, dtype=torch.bfloat16):
                        out = call(q, k, v, cos, sin)
                    out.backward(grad)
                    q.grad = k.grad = v.grad = None
                return timed(step, args.device, args.repeats, args.warmup)
            guarded(results, dict(engine=name, tokens=n_tokens), run)
    results.data['summary'] = attention_summary(results.data['rows'])


def attention_summary(rows: List[dict]) -> dict:
    """Per token count: SDPA's best time over NaLa's best; the count where that ratio crosses 1
    (interpolated in log-log between the measured counts)."""
    def best(prefix, tokens):
        times = [r['ms'] for r in rows if r['tokens'] == tokens and 'ms' in r
                 and r['engine'].split('@')[0] == prefix]
        return min(times) if times else None

    ratios = {}
    for tokens in sorted({r['tokens'] for r in rows}):
        nala, sdpa = best('nala', tokens), best('sdpa', tokens)
        if nala and sdpa:
            ratios[tokens] = sdpa / nala
    crossover = None
    points = sorted(ratios.items())
    for (n0, r0), (n1, r1) in zip(points, points[1:]):
        if r0 < 1 <= r1:
            t = math.log(1 / r0) / math.log(r1 / r0)
            crossover = round(math.exp(math.log(n0) + t * math.log(n1 / n0)))
    if points and points[0][1] >= 1:
        crossover = f'<= {points[0][0]}'
    return dict(sdpa_over_nala=ratios, nala_overtakes_sdpa_at_tokens=crossover)


def stage_cuda_tests(args, results: Results) -> None:
    """The tests, each outcome recorded as pytest reports it (a run stopped at the budget keeps
    the outcomes so far)."""
    marker = 'cuda' if args.device == 'cuda' else 'not cuda'  # the rehearsal runs a CPU share
    selection = ['tests/ops/test_custom_ops.py', '-k', 'relu'] if args.tiny else ['tests']
    deadline = time.monotonic() + STAGES['cuda_tests'] * args.budget - 10
    proc = subprocess.Popen([sys.executable, '-m', 'pytest', *selection, '-m', marker, '-v',
                             '-p', 'no:cacheprovider', '--tb=line'], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = []
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-40:]
        found = re.match(r'(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)', line)
        if found:
            results.add(test=found.group(1), outcome=found.group(2))
        if time.monotonic() > deadline:
            proc.kill()
            tail.append('(stopped at the budget)')
            break
    results.data.update(returncode=proc.wait(), tail=tail)


def _backbone(name: str, tiny: bool):
    """A model of the speed benchmarks by name; with ``tiny``, one of its architecture and
    mixers at toy widths (the rehearsal)."""
    if tiny:
        from mmseg.models.backbones import SwinTransformer

        from nala_mm.models import NaLaFormer
        if name == 'swin_t':
            return SwinTransformer(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 4),
                                   window_size=4)
        arch = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4))
        return NaLaFormer(arch=arch, mixers=('nala',) * 4 if name == 'nala_t_linear' else
                          ('nala', 'nala', 'softmax', 'softmax'))
    from benchmarks.speed.backbone import build_backbone
    from benchmarks.speed.vit import build as build_vit
    if name.startswith('vit_b_'):
        return build_vit('b', name.split('_')[-1])
    return build_backbone(name)


def _train_step(call, model, image, amp: bool, device: str):
    """One training step of ``model`` through ``call`` (the model, or its compiled call)."""
    import torch

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            outs = call(image)
        sum(o.float().sum() for o in outs).backward()
        for p in model.parameters():
            p.grad = None
    return step


def stage_backbones(args, results: Results) -> None:
    import torch
    side = 64 if args.tiny else 1024
    names = (['nala_t_linear', 'swin_t'] if args.tiny else
             ['nala_t_linear', 'nala_t_hybrid', 'swin_t', 'vit_b_nala', 'vit_b_sdpa'])
    for name in names:
        for amp in (False, True):
            def run(name=name, amp=amp):
                model = _backbone(name, args.tiny).to(args.device)
                model.train()
                image = torch.randn(1, 3, side, side, device=args.device)
                return timed(_train_step(model, model, image, amp, args.device), args.device,
                             args.repeats, args.warmup)
            guarded(results, dict(model=name, side=side,
                                  dtype='bf16 autocast' if amp else 'fp32'), run)


def stage_compiled_training(args, results: Results) -> None:
    import torch

    from nala_mm.apis.compile import compile_regions
    side = 64 if args.tiny else 1024
    for name in ('nala_t_linear', 'swin_t'):
        for engine in ('compiled', 'eager'):
            def run(name=name, engine=engine):
                torch._dynamo.reset()
                model = _backbone(name, args.tiny).to(args.device)
                model.train()
                # regional, static shapes: one training size, so a graph per block class and
                # stage width, without the symbolic-shape work a second stage's recompile under
                # dynamic=None would start (which kept the CPU rehearsal's Swin past its budget)
                if engine == 'compiled':
                    compile_regions(model, dynamic=False)
                image = torch.randn(1, 3, side, side, device=args.device)
                return timed(_train_step(model, model, image, True, args.device), args.device,
                             args.repeats, args.warmup)
            guarded(results, dict(model=name, engine=engine, side=side, dtype='bf16 autocast'),
                    run)


STAGE_FUNCTIONS = {'attention': stage_attention, 'cuda_tests': stage_cuda_tests,
                   'backbones': stage_backbones, 'compiled_training': stage_compiled_training}


# ------------------------------------------------------------------------------ the run
def run_stage(args) -> None:
    results = Results(args.out, args.stage, args.device)
    STAGE_FUNCTIONS[args.stage](args, results)
    results.data['done'] = True
    results.write()


def summary(out: str, outcomes: Dict[str, dict]) -> str:
    lines = ['# GPU check', '']
    env_path = osp.join(out, 'attention.json')
    if osp.exists(env_path):
        with open(env_path) as f:
            env = json.load(f)
        lines += [f"{env['card']}, torch {env['torch']} (CUDA {env['cuda']}), numpy "
                  f"{env['numpy']}, mmseg {env['mmseg']}, mmdet {env['mmdet']}.", '']
    lines += ['| stage | budget s | took s | finished | rows |', '|---|---|---|---|---|']
    for stage, o in outcomes.items():
        lines.append(f"| {stage} | {o['budget']:.0f} | {o['seconds']:.0f} | {o['finished']} | "
                     f"{o['rows']} |")
    return '\n'.join(lines) + '\n'


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', required=True, help='folder for the results (at most 8 files)')
    parser.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument('--tiny', action='store_true', help='tiny sizes: the CPU rehearsal')
    parser.add_argument('--wheels', default=osp.join(REPO, '.gpu_wheels', 'carry'))
    parser.add_argument('--budget', type=float, default=1.0,
                        help='scale every stage\'s time budget by this factor')
    parser.add_argument('--stages', nargs='+', choices=list(STAGES), default=list(STAGES))
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--stage', choices=list(STAGES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = osp.abspath(args.out)
    bootstrap(args.wheels)
    os.makedirs(args.out, exist_ok=True)
    if args.stage:
        import nala_mm  # noqa: F401  (registers the models)
        run_stage(args)
        return
    import torch
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('gpu_check: no CUDA device (for the CPU rehearsal: --device cpu --tiny)')
    outcomes = {}
    with open(osp.join(args.out, 'gpu_check.log'), 'a') as log:
        for stage in args.stages:
            budget = STAGES[stage] * args.budget
            command = [sys.executable, '-m', __spec__.name, '--stage', stage, '--out',
                       args.out, '--device', args.device, '--repeats', str(args.repeats),
                       '--warmup', str(args.warmup), '--budget', str(args.budget),
                       *(['--tiny'] if args.tiny else [])]
            start = time.perf_counter()
            log.write(f'== {stage} (budget {budget:.0f} s)\n')
            log.flush()
            try:
                finished = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                          timeout=budget).returncode == 0
            except subprocess.TimeoutExpired:
                finished = False
                log.write(f'== {stage}: stopped at its budget\n')
            path = osp.join(args.out, f'{stage}.json')
            rows = len(json.load(open(path))['rows']) if osp.exists(path) else 0
            outcomes[stage] = dict(budget=budget, seconds=time.perf_counter() - start,
                                   finished=finished, rows=rows)
            print(f'[gpu_check] {stage}: {rows} results in {outcomes[stage]["seconds"]:.0f} s'
                  f'{"" if finished else " (cut short)"}', flush=True)
            with open(osp.join(args.out, 'summary.md'), 'w') as f:
                f.write(summary(args.out, outcomes))


if __name__ == '__main__':
    main()
