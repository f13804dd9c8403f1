"""The README's measured tables match the committed result files they quote.

Numbers in the README are copied from runs (demos, ablation, studies); these checks fail when a
result file is re-measured and the README is not updated, or when a README number is edited by
hand. Each table row is found by its first cell and compared cell by cell.
"""
import json
import os.path as osp
from typing import Dict, List

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
RESULTS = osp.join(REPO, 'benchmarks', 'results')


def readme_rows() -> Dict[str, List[List[str]]]:
    """First cell -> the cells of every markdown table row that starts with it."""
    rows: Dict[str, List[List[str]]] = {}
    with open(osp.join(REPO, 'README.md')) as f:
        for line in f:
            if line.startswith('|') and not line.startswith('|---'):
                cells = [c.strip().strip('*') for c in line.strip().strip('|').split('|')]
                rows.setdefault(cells[0], []).append(cells)
    return rows


def result(name: str) -> dict:
    path = osp.join(RESULTS, name)
    if not osp.exists(path):
        pytest.skip(f'{name} not committed')
    with open(path) as f:
        return json.load(f)


def assert_row(rows, first_cell: str, expected: List[str]) -> None:
    candidates = rows.get(first_cell, [])
    assert any(cells[1:1 + len(expected)] == expected for cells in candidates), (
        f'README row {first_cell!r}: expected cells {expected}, found {candidates}')


def test_segmentation_demo_table_matches_demo_seg_json():
    summary, rows = result('demo_seg.json'), readme_rows()
    for name, cls in summary['per_class'].items():
        assert_row(rows, name, [f"{cls['IoU']:.2f}", f"{cls['Acc']:.2f}"])
    miou = rows['mIoU'][0][1]
    assert miou.startswith(f"{summary['metrics']['mIoU']:.2f}"), miou


def test_detection_demo_table_matches_demo_det_json():
    summary, rows = result('demo_det.json'), readme_rows()
    for name, bbox in summary['per_class']['bbox'].items():
        segm = summary['per_class']['segm'][name]
        assert_row(rows, name, [f"{bbox['mAP']:.3f}", f"{bbox['mAP_50']:.3f}",
                                f"{segm['mAP']:.3f}", f"{segm['mAP_50']:.3f}"])
    with open(osp.join(REPO, 'README.md')) as f:
        text = ' '.join(f.read().split())
    metrics = summary['metrics']
    assert f"bbox mAP {metrics['coco/bbox_mAP']:.3f}" in text
    assert f"segm mAP {metrics['coco/segm_mAP']:.3f}" in text


def test_ablation_table_matches_ablation_json():
    saved, rows = result('ablation.json'), readme_rows()
    for variant, row in saved['summary'].items():
        assert row['runs'] >= 3, f'{variant}: {row["runs"]} runs, the comparison needs >= 3 seeds'
        per_seed = ', '.join(f'{d:+.2f}' for d in row['paired_deltas'])
        assert_row(rows, row['label'], [
            str(row['runs']), f"{row['mIoU_mean']:.2f} ± {row['mIoU_std']:.2f}",
            f"{row['paired_delta_mean']:+.2f} ± {row['paired_delta_std']:.2f} ({per_seed})",
            f"{row['sec_per_iter_best']:.2f}"])
    # every run of the sweep is in the file, with its seed
    assert len(saved['runs']) == sum(row['runs'] for row in saved['summary'].values())
    assert all('seed' in run and 'mIoU' in run for run in saved['runs'])


def test_flops_table_matches_get_flops_output():
    path = osp.join(RESULTS, 'flops_variants.md')  # python tools/get_flops.py --variants
    if not osp.exists(path):
        pytest.skip('flops_variants.md not committed')
    rows = readme_rows()
    with open(path) as f:
        measured = [line.strip().strip('|').split('|') for line in f
                    if line.startswith('| ') and not line.startswith('| variant')]
    assert len(measured) == 5
    for cells in measured:
        variant, params, _, _, backbone, *_, classifier, _, paper = (c.strip() for c in cells)
        readme = rows[variant][0]
        assert readme[1] == f'{params} M', (variant, readme)
        # the README rounds the tool's three decimals to two (5.095 -> 5.10)
        for quoted, value in ((readme[2], backbone), (readme[3], classifier)):
            assert abs(float(quoted) - float(value)) <= 0.005 + 1e-9, (variant, quoted, value)


def test_out_norm_table_matches_out_norm_study_json():
    saved, rows = result('out_norm_study.json'), readme_rows()
    for run in saved['runs']:
        assert_row(rows, run['label'], [f"{run[k]:.3f}" for k in
                                        ('bbox_mAP', 'bbox_mAP_50', 'segm_mAP', 'segm_mAP_50')]
                   + [f"{run['final_acc']:.1f}"])


def sweep_rows(name: str, model: str, reference: str, prefix: str) -> List[tuple]:
    """(first cell, expected cells) of the README's comparison table for a sweep result file:
    time ratio, speed-up, memory ratio, 'peak vs reference peak'."""
    summary = result(name)
    by_key = {(r['model'], r['mode'], r['side']): r for r in summary['rows']}
    expected = []
    for (who, mode, side), row in by_key.items():
        if who != model or row.get('ms_ratio') is None:
            continue
        base = by_key[(reference, mode, side)]
        first = f'{prefix}forward {side}²' if mode == 'fwd' else \
            f"{prefix}training step {side}², batch {row['batch']}"
        expected.append((first, [f"{row['ms_ratio']:.2f}", f"{1 / row['ms_ratio']:.2f}×",
                                 f"{row['mib_ratio']:.2f}",
                                 f"{row['mib']:.0f} vs {base['mib']:.0f} MiB"]))
    return expected


@pytest.mark.parametrize('name, prefix', [('backbone.json', ''), ('segmentor.json', 'UperNet ')])
def test_speed_tables_match_sweep_json(name, prefix):
    rows = readme_rows()
    expected = sweep_rows(name, 'nala_t_linear', 'swin_t', prefix)
    assert expected, f'{name} has no timed all-linear NaLaFormer-T row'
    for first, cells in expected:
        assert_row(rows, first, cells)
