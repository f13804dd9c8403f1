"""docs/longrange.md against benchmarks/results/longrange.json: the page's table and every number
it states come from the committed results, and the results meet the issue's bar (at least 8
variants x 3 seeds, the control at least 15 mIoU below softmax at every seed, attention
statistics for every mixer).

The checks reuse tests/docs/test_readme_numbers.py's machinery (quotes found verbatim, every
measurement-like number on the page inside a checked quote)."""
from statistics import mean, stdev
from typing import List

import pytest

from tests.docs import test_readme_numbers as readme
from tests.docs.test_readme_numbers import Quote, find, load, measurements, read_page, row, source

PAGE = 'docs/longrange.md'
NAME = 'longrange.json'


def pm(value: float, spread: float, sign: bool = False) -> str:
    return f'{value:+.2f} ± {spread:.2f}' if sign else f'{value:.2f} ± {spread:.2f}'


def per_seed(deltas: List[float]) -> str:
    return ', '.join(f'{d:+.2f}' for d in deltas)


def quotes() -> List[Quote]:
    saved = load(NAME)
    summary, stats = saved['summary'], saved['attention']
    found = []
    for variant, s in summary.items():
        found.append(row(s['label'], str(s['runs']), pm(s['mIoU_mean'], s['mIoU_std']),
                         pm(s['object_mIoU_mean'], s['object_mIoU_std']),
                         pm(s['vs_control_mean'], s['vs_control_std'], True)
                         + f" ({per_seed(s['vs_control_deltas'])})",
                         pm(s['vs_softmax_mean'], s['vs_softmax_std'], True)
                         + f" ({per_seed(s['vs_softmax_deltas'])})",
                         f"{s['sec_per_iter_best']:.2f}"))
    for variant, result in stats.items():
        # the trained layer: only stage 1 is decoded (the others get no gradient)
        layer = next(e for e in result['layers'] if e['stage'] == 0)
        rho = layer['spearman_entropy_vs_qnorm']
        share = layer.get('saturated_share')
        found.append(row(f"{summary[variant]['label']}, {layer['layer']}",
                         '-' if rho is None else f'{rho:+.3f}', f"{layer['qnorm_mean']:.2f}",
                         '-' if share is None else f'{100 * share:.1f}%',
                         f"{100 * layer['exemplar_mass_match']:.1f}%",
                         f"{100 * layer['exemplar_mass_other']:.1f}%",
                         f"{100 * layer['exemplar_token_share']:.1f}%"))
    gaps = saved['control_gap']['gaps']
    found += [Quote(f"softmax beats the control by {per_seed(gaps)} mIoU"),
              Quote(f"scores {saved['chance_mIoU']:.2f} mIoU"),
              Quote(f"took {saved['sweep_wall_seconds'] / 60:.0f} min"),
              Quote(f"reach {saved['conv_reach_px']} px")]
    calibration = saved['calibration']
    for step in calibration['steps']:
        found.append(row(step['design'], step['schedule'],
                         ', '.join(f'{m:.2f}' for m in step['softmax']),
                         ', '.join(f'{m:.2f}' for m in step['control']) or '-'))
    return found


def test_results_meet_the_bar():
    saved = load(NAME)
    summary = saved['summary']
    assert len(summary) >= 8, list(summary)
    for variant, s in summary.items():
        assert s['runs'] >= 3, f"{variant}: {s['runs']} runs"
        ok = [r for r in saved['runs'] if r['variant'] == variant and 'mIoU' in r]
        values = [r['mIoU'] for r in ok]
        # the summary is recomputed from the runs, not trusted
        assert s['mIoU_mean'] == pytest.approx(mean(values))
        assert s['mIoU_std'] == pytest.approx(stdev(values))
        control = {r['seed']: r['mIoU'] for r in saved['runs']
                   if r['variant'] == 'identity' and 'mIoU' in r}
        assert s['vs_control_deltas'] == pytest.approx(
            [r['mIoU'] - control[r['seed']] for r in ok])
    gaps = saved['control_gap']['gaps']
    assert len(gaps) >= 3 and min(gaps) >= 15.0, gaps
    assert saved['control_gap']['holds'] is True
    # attention statistics of one trained model of every mixer, every layer
    assert set(saved['attention']) == set(summary)
    for variant, result in saved['attention'].items():
        assert 'error' not in result, (variant, result.get('error'))
        assert len(result['layers']) == 4, variant


def test_page_names_the_results_and_quotes_them():
    assert f'benchmarks/results/{NAME}' in source(PAGE)
    page = read_page(PAGE)
    missing = [q.text + (f' (row {q.row!r})' if q.row else '') for q in quotes()
               if not find(page, q)]
    assert not missing, f'{PAGE} lacks, from {NAME}:\n  ' + '\n  '.join(missing)


def test_every_number_on_the_page_is_checked():
    page = read_page(PAGE)
    covered = [span for q in quotes() for span in find(page, q)]
    unchecked = [f'{token!r} in ...{page.flat[max(0, start - 40):end + 20]}...'
                 for token, start, end in measurements(page)
                 if not any(s <= start and end <= e for s, e in covered)]
    assert not unchecked, f'{PAGE} states numbers no results file backs:\n  ' + \
        '\n  '.join(unchecked)


def test_links_resolve():
    readme.test_relative_links_resolve(PAGE)
