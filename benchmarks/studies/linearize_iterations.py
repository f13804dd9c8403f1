"""The long-range ViT teacher of :mod:`benchmarks.studies.linearize` after 0 (the plain swap),
200, 800 and 2,000 iterations of attention transfer: its zero-shot mIoU, feature error and the
transfer's time, per seed. Results: benchmarks/results/studies/linearize_iterations.{json,md};
discussed in docs/user_guides/linearize.md.

    python -m benchmarks.studies.linearize_iterations
    python -m benchmarks.studies.linearize_iterations --report-only
"""
import argparse
import os
import os.path as osp
from statistics import mean, stdev

from ..lib import report
from ..lib.evaluation import linearize, test_miou
from ..lib.provenance import code_version
from .linearize import TEACHERS, config_text, prepare_data, study_arguments, train_teacher

# The study's 200 transfer iterations leave the ViT short of 90 % zero-shot; how many close it
TRANSFER_ITERATIONS = (0, 200, 800, 2000)


def iterations(args, root: str) -> dict:
    """The ViT teacher's swap after 0 (the plain swap), 200, 800 and 2,000 transfer iterations:
    zero-shot mIoU, the feature error and the transfer's time, per seed."""
    from tqdm import tqdm
    spec = TEACHERS['vit']
    os.makedirs(root, exist_ok=True)
    prepare_data('vit')
    commit = code_version()
    start = train_teacher('vit', spec, root)
    rows = []
    for seed in tqdm(args.seeds, desc='vit seeds'):
        swapped_cfg = osp.join(root, f'swapped_seed{seed}.py')
        with open(swapped_cfg, 'w') as f:
            f.write(config_text('vit', 'plain', seed, spec['finetune_iters']))
        for iters in TRANSFER_ITERATIONS:
            path = osp.join(root, f'transfer{iters}_seed{seed}.pth')
            report = linearize(swapped_cfg, start['checkpoint'], path, iters, seed)
            feature = next(r for r in report['rows'] if r['name'].startswith('features.'))
            rows.append(dict(seed=seed, iters=iters, seconds=report['seconds'],
                             feature_rel_l2=feature['rel_l2_after'],
                             zero_shot_mIoU=test_miou(swapped_cfg, path,
                                                      osp.join(root, f'test{iters}_{seed}'))))
    return dict(commit=commit, spec=dict(label=spec['label'], pretrain_iters=spec[
        'pretrain_iters']), teacher=start, seeds=args.seeds, rows=rows)


def write_iterations(saved: dict, out: str) -> None:
    teacher = saved['teacher']['teacher_mIoU']
    summary = []
    for iters in sorted({r['iters'] for r in saved['rows']}):
        mine = [r for r in saved['rows'] if r['iters'] == iters]
        miou = [r['zero_shot_mIoU'] for r in mine]
        summary.append(dict(iters=iters, mean=mean(miou),
                            std=stdev(miou) if len(miou) > 1 else 0.0,
                            over_teacher=mean(miou) / teacher,
                            feature_rel_l2=mean(r['feature_rel_l2'] for r in mine),
                            seconds=mean(r['seconds'] for r in mine)))
    saved['summary'] = summary
    stem = osp.join(out, 'linearize_iterations')
    report.write_json(stem + '.json', saved)
    lines = ['# Attention transfer on the long-range ViT: zero-shot mIoU against iterations', '',
             f"{saved['spec']['label']}; teacher trained {saved['spec']['pretrain_iters']} "
             f"iterations with softmax, mIoU {teacher:.2f}; per seed ({len(saved['seeds'])}), "
             'the swapped model after N transfer iterations (0: the plain swap), evaluated '
             'without fine-tuning.', '']
    lines += report.markdown_table(
        ['transfer iterations', 'zero-shot mIoU', 'zero-shot / teacher', 'feature rel. L2',
         'seconds'],
        [[s['iters'], report.pm(s['mean'], s['std']), f"{100 * s['over_teacher']:.1f}%",
          report.fmt(s['feature_rel_l2'], 3), report.fmt(s['seconds'])] for s in summary])
    report.write_markdown(stem + '.md', lines)


def main() -> None:
    args = study_arguments(argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter),
        'linearize_iterations')
    if args.report_only:
        write_iterations(report.read_json(osp.join(args.out, 'linearize_iterations.json')),
                         args.out)
        return
    os.makedirs(args.out, exist_ok=True)
    write_iterations(iterations(args, osp.join(args.work_dir, 'iterations')), args.out)
    print(open(osp.join(args.out, 'linearize_iterations.md')).read())


if __name__ == '__main__':
    main()
