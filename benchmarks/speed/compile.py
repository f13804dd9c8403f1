"""torch.compile benchmark: compiled against eager for the NaLa layer, its ops and the models, the
compile time (cold and warm, whole-model and regional), and how many graphs the sizes a user
meets compile.

Engines (the model's ``@`` suffix): ``eager`` / ``fast`` the hand-written custom ops run eager;
``reference`` the plain formulas, eager; ``compiled`` the model compiled whole (inductor, static
shapes: one training size) with ``mode='fast'``, i.e. the custom ops as nodes of the graph;
``compiled-reference`` the reference formulas compiled, which inductor fuses itself;
``regional`` each repeated block class compiled once (:func:`nala_mm.apis.compile.compile_regions`).

Parts (``--parts``; each run replaces its parts' rows in the JSON, or with ``--sides`` their rows
at those sides, and keeps the others'; each row names the code version it ran on):

* ``recompiles``: graphs compiled by :func:`nala_mm.apis.compile.compile_feature_extraction`
  (dynamic sizes, dynamo's graph capture with ``backend='eager'``) over each size sequence of
  :data:`benchmarks.lib.recompiles.SIZE_SEQUENCES`, after each size;
* ``layer``: the NaLa layer (NaLaFormer-T's stage-1 shape, C = 64, one head, channels-last
  tokens), forward + backward at 4,096 and 16,384 tokens; on CUDA also global softmax through
  SDPA, compiled, and ``--layer-sides 128 256`` reaches 65,536 tokens;
* ``nodes``: each custom op of ``nala_mm/ops`` at NaLaFormer-T's stage-1 training shapes (a 512²
  crop, batch 2: 128 x 128 tokens, C = 64), forward + backward. The page's keep / remove table
  applies the rule an op earns its place by: at least 5 % faster than the eager reference
  (median per-round time ratio) or at least 10 % less peak memory, in the op alone or in a model;
* ``nodes_model``: the all-linear NaLaFormer-T's training step (512², batch 2) with every op fast
  against the step with one op on its reference formula;
* ``backbone``: the all-linear NaLaFormer-T (eager, reference, compiled, regional) against
  Swin-T (eager, compiled, regional): the training step (batch 2) at 512² and 1024², the forward
  at 2048²;
* ``vit``: NaLa ViT-S / ViT-B (eager, reference, compiled) against the same ViT with fused SDPA,
  compiled: the training step at 512² and 1024², the forward at 2048²;
* ``upernet``: UperNet + all-linear NaLaFormer-T against UperNet + Swin-T, both with their
  feature extraction compiled (the tools' ``--compile``): inference at 2048².

``--profile`` then names where the time goes: the all-linear NaLaFormer-T's training step
(512², batch 2), eager and compiled whole, under ``torch.profiler`` (the ops with the most time
of their own), and the phases of its cold compile (dynamo's ``compile_times``).

Compiled models are called once before measuring; that first call's seconds are the row's
``setup_s``, taken in the memory process with an empty inductor cache (cold), and again as
``warm_setup_s`` in the timing process, which reuses that process's on-disk caches (warm). On
:func:`benchmarks.lib.grid.run_grid`: peak memory per model in a process of its own, the models
of a case timed in turns. Results: benchmarks/results/speed/compile.{json,md,png}; discussed in
docs/reports/speed.md.

    python -m benchmarks.speed.compile                            # every part
    python -m benchmarks.speed.compile --parts recompiles layer
    python -m benchmarks.speed.compile --device cuda --parts layer --layer-sides 128 256
    python -m benchmarks.speed.compile --parts vit --sides 512 2048 --profile
    python -m benchmarks.speed.compile --report-only
"""
import argparse
import importlib
import os
import os.path as osp
import tempfile
import time
from typing import List, Tuple

import torch

from nala_mm.analysis.measure import Step, device_name

from ..lib import report
from ..lib.grid import grid_cli, per_round_ratio, run_grid
from ..lib.provenance import code_version
from ..lib.recompiles import SIZE_SEQUENCES, count_compilations
from ..lib.sweep import backbone_step

# each custom op of nala_mm/ops and the op module whose resolve_mode picks its path
NODES = {'attention': 'nala_mm.ops.attention.dispatch', 'gelu_conv': 'nala_mm.ops.fused.gelu_conv',
         'lepe_conv': 'nala_mm.ops.fused.conv_weight_grad'}
COMPILED = ('compiled', 'compiled-reference', 'regional')
PARTS = {
    'layer': dict(models=[f'layer@{engine}' for engine in
                          ('reference', 'fast', 'compiled', 'compiled-reference')]),
    'nodes': dict(models=[f'{node}@{engine}' for node in NODES
                          for engine in ('fast', 'reference', 'compiled', 'compiled-reference')],
                  cases=[('train', 128, 2)]),
    'nodes_model': dict(models=['nala_t_linear@fast'] + [f'nala_t_linear@{node}-reference'
                                                         for node in NODES],
                        cases=[('train', 512, 2)]),
    'backbone': dict(models=[*(f'nala_t_linear@{e}' for e in
                               ('eager', 'reference', 'compiled', 'regional')),
                             *(f'swin_t@{e}' for e in ('eager', 'compiled', 'regional'))],
                     cases=[('train', 512, 2), ('train', 1024, 2), ('fwd', 2048, 1)]),
    'vit': dict(models=[f'vit_{w}_{kind}' for w in ('s', 'b') for kind in
                        ('nala@eager', 'nala@reference', 'nala@compiled', 'sdpa@compiled')],
                cases=[('train', 512, 1), ('train', 1024, 1), ('fwd', 2048, 1)]),
    'upernet': dict(models=['nala_t_linear@compiled', 'swin_t@compiled'],
                    cases=[('fwd', 2048, 1)]),
}
# the GPU's softmax baseline: SDPA's fused FlashAttention kernels have no CPU counterpart
CUDA_MODELS = {'layer': ['sdpa@compiled']}
# per part: (first model, second model); the page's ratio column is the second's time over the
# first's (> 1: the first is faster)
RATIOS = {'layer': [('layer@fast', 'layer@reference'), ('layer@compiled', 'layer@fast'),
                    ('layer@compiled', 'layer@reference'),
                    ('layer@compiled', 'layer@compiled-reference'),
                    ('layer@compiled', 'sdpa@compiled')],
          'nodes': [(f'{node}@{first}', f'{node}@{second}') for node in NODES
                    for first, second in (('fast', 'reference'), ('compiled', 'fast'),
                                          ('compiled', 'compiled-reference'))],
          'nodes_model': [('nala_t_linear@fast', f'nala_t_linear@{node}-reference')
                          for node in NODES],
          'backbone': [('nala_t_linear@compiled', 'nala_t_linear@eager'),
                       ('nala_t_linear@regional', 'nala_t_linear@eager'),
                       ('nala_t_linear@compiled', 'nala_t_linear@reference'),
                       ('swin_t@compiled', 'swin_t@eager'),
                       ('swin_t@regional', 'swin_t@eager'),
                       ('nala_t_linear@eager', 'swin_t@eager'),
                       ('nala_t_linear@compiled', 'swin_t@compiled'),
                       ('nala_t_linear@regional', 'swin_t@regional')],
          'vit': [pair for w in ('s', 'b') for pair in (
              (f'vit_{w}_nala@compiled', f'vit_{w}_nala@eager'),
              (f'vit_{w}_nala@compiled', f'vit_{w}_nala@reference'),
              (f'vit_{w}_nala@compiled', f'vit_{w}_sdpa@compiled'))],
          'upernet': [('nala_t_linear@compiled', 'swin_t@compiled')]}


def build(part: str, base: str, engine: str, device: str):
    """The module ``base`` of ``part``, on ``device``, as ``engine`` runs it (not compiled)."""
    mode = 'reference' if engine in ('reference', 'compiled-reference') else 'fast'
    if part == 'layer':
        from nala_mm.models import NormAwareLinearAttention
        if base == 'sdpa':
            from nala_mm.models.mixer_specs import build_mixer, mixer_config
            return build_mixer(mixer_config('sdpa'), embed_dims=64, num_heads=1).to(device)
        return NormAwareLinearAttention(64, 1, kernel='relu', mode=mode).to(device)
    if part in ('backbone', 'nodes_model'):
        from .backbone import build_backbone
        return build_backbone(base, mode).to(device)
    if part == 'vit':
        from .vit import build as build_vit
        _, width, kind = base.split('_')
        return build_vit(width, kind, mode).to(device)
    from nala_mm.apis.config_loading import build_model_from_config

    from .segmentor import SEGMENTORS
    model, _ = build_model_from_config(SEGMENTORS[base]['config'],
                                       {'model.backbone.init_cfg': None})
    return model.to(device)


def compiled(module, engine: str):
    """What ``engine`` calls: the module itself (eager; regional, whose blocks are compiled in
    place here), or the module compiled whole with static shapes."""
    from nala_mm.apis.compile import compile_model, compile_regions
    if engine == 'regional':
        compile_regions(module, dynamic=False)
        return module
    if engine in ('compiled', 'compiled-reference'):
        return compile_model(module, dynamic=False)
    return module


def node_call(node: str, side: int, batch: int, mode: str, device: str):
    """One op of ``nala_mm.ops`` in ``mode`` on stage-1 shapes, as ``(fn, inputs)``."""
    from nala_mm import ops
    tokens = dict(device=device, requires_grad=True)
    if node == 'attention':
        rope = tuple(t.to(device) for t in ops.rope_table(side, side, 64))
        cfg = ops.NaLaConfig(kernel='relu')
        inputs = [torch.randn(batch, 1, side * side, 64, **tokens) for _ in range(3)]
        return (lambda q, k, v: ops.nala_attention(q, k, v, cfg, rope, mode=mode)), inputs
    channels, kernel = (256, 3) if node == 'gelu_conv' else (64, 5)  # FFN dwconv / LePE
    x = torch.randn(batch, channels, side, side, device=device).to(
        memory_format=torch.channels_last).requires_grad_(True)
    inputs = [x, torch.randn(channels, 1, kernel, kernel, **tokens),
              torch.zeros(channels, **tokens)]
    pad = (kernel // 2,) * 2
    if node == 'gelu_conv':
        return (lambda a, w, b: ops.gelu_conv(a, w, b, pad, channels, mode=mode)), inputs
    return (lambda a, w, b: ops.conv2d(a, w, b, padding=pad, groups=channels, mode=mode)), inputs


def make_step(name: str, case: dict) -> Step:
    part, (base, engine), device = case['part'], name.split('@'), case['device']
    side, batch, mode = case['side'], case['batch'], case['mode']
    if part == 'nodes':
        fn, inputs = node_call(base, side, batch,
                               'reference' if engine.endswith('reference') else 'fast', device)
        fn = torch.compile(fn, dynamic=False) if engine in COMPILED else fn
        grad = torch.randn_like(fn(*inputs))

        def step() -> None:
            fn(*inputs).backward(grad)
            for t in inputs:
                t.grad = None
        return _timed_first_call(step, device) if engine in COMPILED else step
    module = build(part, base, engine, device)
    if part == 'nodes_model':
        image = torch.randn(batch, 3, side, side, device=device)
        if engine == 'fast':
            return backbone_step(module, image, mode)
        return _on_reference(backbone_step(module, image, mode), engine[:-len('-reference')])
    if part == 'layer':
        x = torch.randn(batch, side, side, 64, device=device, requires_grad=True)
        grad = torch.randn_like(x)
        fn = compiled(module, engine)

        def step() -> None:
            fn(x).backward(grad)
            x.grad = None
            module.zero_grad(set_to_none=True)
    elif part == 'upernet':
        from nala_mm.apis.compile import compile_feature_extraction
        compile_feature_extraction(module.eval())  # as the tools compile it: dynamic sizes
        images = torch.randn(batch, 3, side, side, device=device)

        def step() -> None:
            with torch.no_grad():
                module(images, mode='tensor')
    else:
        image = torch.randn(batch, 3, side, side, device=device)
        step = backbone_step(module, image, mode, call=compiled(module, engine))
    return _timed_first_call(step, device) if engine in COMPILED else step


def _on_reference(step: Step, node: str) -> Step:
    """``step`` with ``node``'s op on its reference formula while it runs: its op module's
    ``resolve_mode`` answers ``'reference'``, the other nodes stay fast."""
    module = importlib.import_module(NODES[node])

    def reference_step() -> None:
        chosen = module.resolve_mode
        module.resolve_mode = lambda mode, traceable=False: 'reference'
        try:
            step()
        finally:
            module.resolve_mode = chosen
    return reference_step


def _timed_first_call(step: Step, device: str) -> Step:
    """``step`` after its first, compiling call, whose seconds it carries as ``setup_s``."""
    start = time.perf_counter()
    step()
    if device == 'cuda':
        torch.cuda.synchronize()
    step.setup_s = time.perf_counter() - start
    return step


PROFILE_CASE = dict(model='nala_t_linear', side=512, batch=2)
PROFILE_TOP = 12  # ops per table


def profile_compiled(device: str, rounds: int = 2) -> dict:
    """Where :data:`PROFILE_CASE`'s training step spends its time, eager and compiled whole:
    per engine the ops with the most self time (ms per step, share of the step's self time), and
    the cold compile's phases in seconds (nested: a phase includes those it calls)."""
    from torch._dynamo.utils import compilation_time_metrics
    from torch.profiler import ProfilerActivity, profile
    os.environ['TORCHINDUCTOR_CACHE_DIR'] = tempfile.mkdtemp(prefix='nala-compile-profile-')
    torch._dynamo.reset()
    compilation_time_metrics.clear()
    image = torch.randn(PROFILE_CASE['batch'], 3, PROFILE_CASE['side'], PROFILE_CASE['side'],
                        device=device)
    found = dict(PROFILE_CASE, rounds=rounds)
    for engine in ('eager', 'compiled'):
        module = build('backbone', PROFILE_CASE['model'], engine, device)
        step = backbone_step(module, image, 'train', call=compiled(module, engine))
        start = time.perf_counter()
        step()  # compiles (compiled) or warms up (eager)
        if engine == 'compiled':
            found['compile_s'] = time.perf_counter() - start
            found['compile_phases'] = sorted(
                ((name, sum(times)) for name, times in compilation_time_metrics.items()),
                key=lambda item: -item[1])[:PROFILE_TOP]
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == 'cuda'
                                               else [])
        with profile(activities=activities) as prof:
            for _ in range(rounds):
                step()
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) or 1
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:PROFILE_TOP]
        found[engine] = [dict(op=e.key, calls=e.count // rounds,
                              self_ms=e.self_cpu_time_total / 1e3 / rounds,
                              share=e.self_cpu_time_total / total) for e in top]
        found[f'{engine}_step_ms'] = total / 1e3 / rounds
    # inductor's generated kernels run inside its graphs' calls (forward, backward: both among
    # the top ops of a whole-model compile)
    found['compiled_generated_share'] = sum(
        r['self_ms'] for r in found['compiled']
        if r['op'].startswith('## Call CompiledFxGraph')) / found['compiled_step_ms']
    return found


def profile_lines(found: dict) -> List[str]:
    """The page's section for :func:`profile_compiled`'s result."""
    lines = ['', f"## Where the time goes: {found['model']} training step, {found['side']}², "
             f"batch {found['batch']} (torch.profiler, {found['rounds']} steps)\n",
             f"Self time per step: eager {report.fmt(found['eager_step_ms'])} ms, compiled "
             f"{report.fmt(found['compiled_step_ms'])} ms, of which inductor's generated "
             f"kernels {100 * found['compiled_generated_share']:.0f} %; the compiled model's "
             f"first call took {report.fmt(found['compile_s'])} s.\n"]
    for engine in ('eager', 'compiled'):
        lines += [f'**{engine}**\n']
        lines += report.markdown_table(
            ['op', 'calls per step', 'self ms per step', 'share'],
            [[r['op'], r['calls'], report.fmt(r['self_ms']), f"{100 * r['share']:.0f} %"]
             for r in found[engine]])
        lines += ['']
    lines += ['**cold compile phases** (seconds; nested)\n']
    lines += report.markdown_table(['phase', 's'], [[name, report.fmt(seconds)]
                                                    for name, seconds in found['compile_phases']])
    return lines


# ------------------------------------------------------------------------------ the page
def ratio_rows(rows: List[dict]) -> List[dict]:
    """Each comparison of :data:`RATIOS` per case: time as the median of per-round ratios (the
    second model's time over the first's: > 1 means the first is faster), memory plainly."""
    found = []
    for row in rows:
        for first, second in RATIOS.get(row['part'], []):
            if row['model'] != first:
                continue
            other = next((r for r in rows if r['part'] == row['part'] and r['model'] == second
                          and r['mode'] == row['mode'] and r['side'] == row['side']), None)
            if other is None:
                continue
            found.append(dict(part=row['part'], mode=row['mode'], side=row['side'],
                              faster=first, slower=second,
                              speedup=per_round_ratio(other, row),
                              memory_ratio=(row['mib'] / other['mib']
                                            if row.get('mib') and other.get('mib') else None)))
    return found


KEEP_SPEEDUP, KEEP_MEMORY = 1.05, 0.90  # >= 5 % faster, or >= 10 % less peak memory


def keep_rows(ratios: List[dict]) -> Tuple[List[list], List[int]]:
    """Per node: its eager gains over the reference alone and in NaLaFormer-T's training step at
    each measured size, against compiled code, and the verdict (kept if any place meets the
    rule)."""
    sides = sorted({r['side'] for r in ratios if r['part'] == 'nodes_model'})
    rows = []
    for node in NODES:
        def pair(first, second):
            return next((r for r in ratios if r['part'] == 'nodes'
                         and (r['faster'], r['slower']) == (f'{node}@{first}',
                                                            f'{node}@{second}')), None)
        in_model = [next((r for r in ratios if r['part'] == 'nodes_model' and r['side'] == side
                          and r['slower'] == f'nala_t_linear@{node}-reference'), None)
                    for side in sides]
        eager, compiled = pair('fast', 'reference'), pair('compiled', 'compiled-reference')
        if eager is None or eager['speedup'] is None:
            continue
        keep = any(r['speedup'] >= KEEP_SPEEDUP or (r['memory_ratio'] or 1) <= KEEP_MEMORY
                   for r in (eager, *in_model) if r and r['speedup'])
        rows.append([node, report.fmt(eager['speedup'], 2), report.fmt(eager['memory_ratio'], 2),
                     *[report.fmt(r and r[key], 2) for r in in_model
                       for key in ('speedup', 'memory_ratio')],
                     report.fmt(compiled and compiled['speedup'], 2),
                     'keep' if keep else 'remove'])
    return rows, sides


def write_outputs(saved: dict, stem: str) -> None:
    saved['ratios'] = ratio_rows(saved['rows'])
    report.write_json(stem + '.json', saved)
    runs = ', '.join(f"{part}: {run['repeats']} timed rounds in turns after {run['warmup']} "
                     f"warm-up (code {run.get('commit', saved['commit'])})"
                     for part, run in saved.get('runs', {}).items())
    lines = [f"# torch.compile\n\n{saved['device']}, torch {saved['torch']}. "
             f"{runs or 'No timed part has run.'}\n",
             '## Graphs compiled over the sizes users meet\n']
    lines += report.markdown_table(
        ['size sequence', 'sizes (H, W)', 'graphs after each size'],
        [[name, ', '.join(f'{h}x{w}' for h, w in SIZE_SEQUENCES[name]['sizes']), counts]
         for name, counts in saved.get('recompiles', {}).items()])
    lines += ['', '## Time and memory\n']
    lines += report.markdown_table(
        ['part', 'mode', 'side', 'model', 'ms (median)', 'peak MiB', 'compile s'],
        [[r['part'], r['mode'], r['side'], r['model'], report.fmt(r.get('ms')),
          report.fmt(r.get('mib'), 0), report.fmt(r.get('setup_s'))] for r in saved['rows']])
    lines += ['', '## Ratios (the second model\'s time over the first\'s)\n']
    lines += report.markdown_table(
        ['part', 'mode', 'side', 'first', 'second', 'speed-up', 'memory first / second'],
        [[r['part'], r['mode'], r['side'], r['faster'], r['slower'], report.fmt(r['speedup'], 2),
          report.fmt(r['memory_ratio'], 2)] for r in saved['ratios']])
    lines += ['', '## Compile time: the first call, cold (empty caches) and warm\n']
    lines += report.markdown_table(
        ['part', 'mode', 'side', 'model', 'cold s', 'warm s'],
        [[r['part'], r['mode'], r['side'], r['model'], report.fmt(r.get('setup_s')),
          report.fmt(r.get('warm_setup_s'))] for r in saved['rows']
         if r.get('setup_s') is not None and r['part'] in ('backbone', 'vit')])
    lines += ['', '## The custom ops: keep or remove\n']
    verdicts, sides = keep_rows(saved['ratios'])
    lines += report.markdown_table(
        ['node', 'op: fast vs reference, speed-up', 'op: peak memory fast / reference',
         *[f'NaLaFormer-T step {side}²: {what}' for side in sides
           for what in ('speed-up', 'peak memory')],
         'compiled: op vs compiled reference, speed-up', 'verdict'], verdicts)
    if saved.get('profile'):
        lines += profile_lines(saved['profile'])
    report.write_markdown(stem + '.md', lines)
    plot(saved['ratios'], stem + '.png')


def plot(ratios: List[dict], path: str) -> None:
    plt = report.pyplot()
    shown = [r for r in ratios if r['speedup']]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(shown) + 1.5))
    labels = [f"{r['part']} {r['mode']} {r['side']}: {r['faster']} vs {r['slower']}"
              for r in shown]
    ax.barh(range(len(shown)), [r['speedup'] for r in shown], color='tab:blue')
    ax.axvline(1.0, color='black', lw=0.8)
    ax.set_yticks(range(len(shown)), labels, fontsize=8)
    ax.set_xscale('log')
    ax.set_xlabel('speed-up (second model time / first model time, median of rounds)')
    ax.set_title('torch.compile: speed-ups measured in turns')
    report.save_figure(fig, path)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--parts', nargs='+', choices=['recompiles', *PARTS],
                        default=['recompiles', *PARTS])
    parser.add_argument('--layer-sides', nargs='+', type=int, default=[64, 128],
                        help='square token grids of the layer part (64: 4,096 tokens)')
    parser.add_argument('--repeats', type=int, default=3, help='timed rounds in turns')
    parser.add_argument('--warmup', type=int, default=1, help='untimed rounds before timing')
    parser.add_argument('--timeout', type=int, default=3600, help='seconds per measurement')
    parser.add_argument('--sides', nargs='+', type=int,
                        help="only the cases at these sides (the layer's: --layer-sides)")
    parser.add_argument('--profile', action='store_true',
                        help='then profile NaLaFormer-T training, eager and compiled')


def main() -> None:
    parsed = grid_cli(__doc__, 'compile', make_step, write_outputs, arguments)
    if parsed is None:
        return
    args, stem = parsed
    os.makedirs(args.out, exist_ok=True)
    saved = (report.read_json(stem + '.json') if osp.exists(stem + '.json')
             else dict(rows=[], recompiles={}))
    saved.update(commit=code_version(), device=device_name(args.device),
                 torch=torch.__version__)
    if args.profile:
        saved.pop('profile', None)  # measured again below; the page renders the current form
    if 'recompiles' in args.parts:
        saved['recompiles'] = {name: count_compilations(name) for name in SIZE_SEQUENCES}
        write_outputs(saved, stem)
    # an empty inductor cache for this run: each compiled model's first call really compiles
    os.environ['TORCHINDUCTOR_CACHE_DIR'] = tempfile.mkdtemp(prefix='nala-compile-bench-')
    for part in (p for p in PARTS if p in args.parts):
        plan = ([('train', side, 1) for side in args.layer_sides] if part == 'layer'
                else [case for case in PARTS[part]['cases']
                      if args.sides is None or case[1] in args.sides])
        # the part's rows at the sides not measured now stay, with the code they ran on
        kept = [r for r in saved['rows'] if r['part'] != part
                or (part != 'layer' and args.sides is not None and r['side'] not in args.sides)]
        commit = code_version()
        saved.setdefault('runs', {})[part] = dict(repeats=args.repeats, warmup=args.warmup,
                                                  commit=commit)
        models = PARTS[part]['models'] + (CUDA_MODELS.get(part, []) if args.device == 'cuda'
                                          else [])
        cases = [(dict(part=part, mode=mode, side=side, batch=batch), models)
                 for mode, side, batch in plan]
        rows = run_grid(__spec__.name, cases, repeats=args.repeats, warmup=args.warmup,
                        device=args.device, timeout=args.timeout, desc=f'compile {part}',
                        after_case=lambda done, kept=kept: write_outputs(
                            dict(saved, rows=kept + done), stem))
        saved['rows'] = kept + [dict(row, commit=commit) for row in rows]
        write_outputs(saved, stem)
    if args.profile:
        saved['profile'] = dict(profile_compiled(args.device), commit=code_version())
        write_outputs(saved, stem)
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
