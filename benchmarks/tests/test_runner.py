"""The one runner: every benchmark module is declared to it, and it writes every results page
again, byte for byte, from the committed results (the figures are drawn again, not compared)."""
import os
import subprocess
import sys

import pytest

from benchmarks.registry import registry
from tests.helpers import REPO


def test_every_benchmark_module_is_declared_once():
    """A module under benchmarks/speed/ or benchmarks/studies/ with a ``main`` is a benchmark,
    run by name through ``python -m benchmarks``; a project declares its own."""
    modules = {f'benchmarks.{path.parent.name}.{path.stem}' for kind in ('speed', 'studies')
               for path in (REPO / 'benchmarks' / kind).glob('*.py')
               if 'def main(' in path.read_text()}
    table = registry()
    declared = {bench.module for bench in table.values()}
    assert modules and modules <= declared, f'not declared: {sorted(modules - declared)}'
    assert {'longrange', 'longrange_graded'} <= set(table)  # found in projects/longrange


def test_list_names_every_benchmark():
    proc = subprocess.run([sys.executable, '-m', 'benchmarks', 'list'], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = [line.split()[0] for line in proc.stdout.splitlines()]
    assert listed == list(registry())


def test_an_unknown_name_is_refused_with_the_known_ones():
    proc = subprocess.run([sys.executable, '-m', 'benchmarks', 'run', 'atention'], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "unknown benchmark(s) ['atention']" in proc.stderr
    assert "'attention'" in proc.stderr


@pytest.mark.integration
def test_every_page_is_written_again_byte_for_byte(tmp_path):
    reports = [b for b in registry().values() if b.report_only]
    proc = subprocess.run([sys.executable, '-m', 'benchmarks', 'report', '--out',
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, MPLBACKEND='Agg'))
    assert proc.returncode == 0, proc.stderr[-3000:]
    differ = [f'{b.name}: {stem}.md' for b in reports for stem in b.stems
              if (tmp_path / f'{stem}.md').read_bytes()
              != (REPO / b.results / f'{stem}.md').read_bytes()]
    assert not differ, differ
    drawn = [p.name for p in tmp_path.glob('*.png')]
    assert len(drawn) >= 10, drawn
