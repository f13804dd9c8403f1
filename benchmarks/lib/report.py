"""Writing a benchmark's results: the JSON, markdown tables and pages, and the plots; the
report-only mode that rewrites a page and its plot from the saved JSON."""
import argparse
import json
from statistics import mean, stdev
from typing import Dict, List, Optional, Sequence


def add_report_only_argument(parser: argparse.ArgumentParser, name: str) -> None:
    """``--report-only``: rewrite ``OUT/name.md`` and its plot from ``OUT/name.json``."""
    parser.add_argument('--report-only', action='store_true',
                        help=f'rewrite the markdown table and plot from OUT/{name}.json')


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def write_json(path: str, payload: dict) -> None:
    with open(path, 'w') as f:
        json.dump(payload, f, indent=2)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> List[str]:
    """The lines of a markdown table: the header, its rule, one line per row."""
    return ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)] + \
        ['| ' + ' | '.join(map(str, row)) + ' |' for row in rows]


def write_markdown(path: str, lines: Sequence[str]) -> None:
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def fmt(value: Optional[float], digits: int = 1) -> str:
    return '-' if value is None else f'{value:.{digits}f}'


def pm(value: Optional[float], spread: Optional[float], sign: bool = False) -> str:
    """``mean ± std`` to two decimals (a missing spread reads 0; a missing value ``-``)."""
    if value is None:
        return '-'
    return f'{value:+.2f} ± {spread or 0:.2f}' if sign else f'{value:.2f} ± {spread or 0:.2f}'


def signed(values: Sequence[float]) -> str:
    """Per-seed differences, signed: ``+1.23, -0.45``."""
    return ', '.join(f'{v:+.2f}' for v in values)


def pyplot():
    """matplotlib.pyplot on the file-only backend (no display needed)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str, dpi: int = 120) -> None:
    """Lay ``fig`` out, write it to ``path`` and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def log_log_axes(ax, title: str, xlabel: str) -> None:
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, which='both', alpha=0.3)


def seed_scatter(ax, runs: Sequence[dict], summary: Dict[str, dict], rotation: int = 15) -> None:
    """Every run's mIoU per variant (dots) with the variant's mean and std beside them: the
    picture of a mixer comparison over seeds (ablation.py, projects/longrange/study.py)."""
    names = list(summary)
    for i, variant in enumerate(names):
        values = [r['mIoU'] for r in runs if r['variant'] == variant and 'mIoU' in r]
        ax.scatter([i] * len(values), values, color='#4c72b0', zorder=3)
        if values:
            ax.errorbar(i + 0.15, mean(values), yerr=stdev(values) if len(values) > 1 else 0,
                        fmt='s', color='#dd8452', capsize=4, zorder=3)
    ax.set_xticks(range(len(names)), [summary[n]['label'] for n in names], rotation=rotation,
                  ha='right', fontsize=8)
