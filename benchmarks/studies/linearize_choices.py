"""The attention transfer's design choices, measured on the Swin teacher of
:mod:`benchmarks.studies.linearize`: the target (block or attention output), the inputs (the
teacher's or the student's own sequence), which parameters learn (the mixer or only its new
parts) and the learning rate; for each, the zero-shot mIoU of the swapped model and its feature
error against the teacher. Results: benchmarks/results/studies/linearize_choices.{json,md};
discussed in docs/user_guides/linearize.md.

    python -m benchmarks.studies.linearize_choices
    python -m benchmarks.studies.linearize_choices --report-only
"""
import argparse
import os
import os.path as osp

from ..lib import report
from ..lib.evaluation import linearize, test_miou
from ..lib.provenance import code_version
from .linearize import TEACHERS, config_text, prepare_data, study_arguments, train_teacher

CHOICES = [dict(target=t, inputs=i, params=p) for t in ('block', 'attention')
           for i in ('teacher', 'sequence') for p in ('mixer', 'new')]
LEARNING_RATES = (3e-4, 1e-3, 3e-3)


def choices(args, root: str) -> dict:
    from tqdm import tqdm
    spec = TEACHERS['swin']
    os.makedirs(root, exist_ok=True)
    prepare_data('swin')
    commit = code_version()
    start = train_teacher('swin', spec, root)
    swapped_cfg = osp.join(root, 'swapped.py')
    with open(swapped_cfg, 'w') as f:
        f.write(config_text('swin', 'plain', 0, spec['finetune_iters']))
    results = []

    def measure(options: dict, iters: int) -> dict:
        path = osp.join(root, f'choice{len(results)}.pth')
        extra = [x for k, v in options.items() for x in (f'--{k}', str(v))]
        report = linearize(swapped_cfg, start['checkpoint'], path, iters, 0, extra)
        feats = {r['name']: r['rel_l2_after'] for r in report['rows']
                 if r['name'].startswith('features.')}
        return dict(options=dict(report['options']), iters=iters, features=feats,
                    seconds=report['seconds'],
                    zero_shot_mIoU=test_miou(swapped_cfg, path, osp.join(root, 'test')))

    results.append(dict(measure({}, 0), plain_swap=True))
    for options in tqdm(CHOICES, desc='choices'):
        results.append(measure(dict(options, lr=1e-3), spec['transfer_iters']))
    best = max(results[1:], key=lambda r: r['zero_shot_mIoU'])['options']
    for lr in tqdm([x for x in LEARNING_RATES if x != 1e-3], desc='learning rates'):
        chosen = {k: best[k] for k in ('target', 'inputs', 'params')}
        results.append(measure(dict(chosen, lr=lr), spec['transfer_iters']))
    return dict(commit=commit, teacher=start, spec=spec, results=results)


def write_choices(saved: dict, out: str) -> None:
    stem = osp.join(out, 'linearize_choices')
    report.write_json(stem + '.json', saved)
    lines = ['# Attention transfer: the design choices, measured', '',
             f"{saved['spec']['label']}; teacher mIoU {saved['teacher']['teacher_mIoU']:.2f}; "
             f"each choice {saved['spec']['transfer_iters']} transfer iterations (seed 0), then "
             'the zero-shot mIoU of the swapped model and the relative L2 error of its '
             'features against the teacher on held-out training batches.', '']
    rows = []
    for r in saved['results']:
        o = r['options']
        name = 'plain swap (no transfer)' if r.get('plain_swap') else \
            f"{o['target']}, {o['inputs']} inputs, {o['params']} params, lr {o['lr']:g}"
        rows.append([name, f"{r['zero_shot_mIoU']:.2f}"] +
                    [report.fmt(r['features'][k], 3) for k in sorted(r['features'])] +
                    [report.fmt(r['seconds'])])
    width = len(saved['results'][0]['features'])
    lines += report.markdown_table(['choice', 'zero-shot mIoU'] +
                            [f'feature {i} rel. L2' for i in range(width)] + ['seconds'], rows)
    report.write_markdown(stem + '.md', lines)


def main() -> None:
    args = study_arguments(argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter),
        'linearize_choices')
    if args.report_only:
        write_choices(report.read_json(osp.join(args.out, 'linearize_choices.json')), args.out)
        return
    os.makedirs(args.out, exist_ok=True)
    write_choices(choices(args, osp.join(args.work_dir, 'choices')), args.out)
    print(open(osp.join(args.out, 'linearize_choices.md')).read())


if __name__ == '__main__':
    main()
