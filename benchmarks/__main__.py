"""The one runner of the benchmarks and studies declared in :mod:`benchmarks.registry`.

    python -m benchmarks list                         # name, what it measures, where it writes
    python -m benchmarks run NAME [ARGS ...]          # e.g. run vit --sizes 512 1024
    python -m benchmarks run NAME --report-only       # the page and plot again from the JSON
    python -m benchmarks report [NAME ...] [--out DIR]

``run`` hands ``ARGS`` to the benchmark's own command line (``python -m benchmarks run NAME
--help`` lists them; ``--out DIR`` and ``--device cuda`` where it measures speed). ``report``
writes every page again from its results (a report's ``--report-only``), in place, or with
``--out`` into ``DIR`` from copies of the committed inputs, so that the committed pages can be
compared with what the code renders today.
"""
import argparse
import os
import os.path as osp
import runpy
import shutil
import sys
from typing import List, Optional

from .registry import Benchmark, registry


def run(bench: Benchmark, args: List[str]) -> None:
    """``python -m MODULE ARGS`` in this process (the benchmark's own children are processes
    of their own, started by module name)."""
    saved = sys.argv
    sys.argv = [bench.module, *args]
    try:
        runpy.run_module(bench.module, run_name='__main__', alter_sys=True)
    finally:
        sys.argv = saved


def report(bench: Benchmark, out: Optional[str]) -> None:
    """``bench``'s pages again from its results, in place or into ``out`` (inputs copied)."""
    if not bench.report_only:
        raise ValueError(f'benchmark {bench.name!r} writes no report (only '
                         f'{", ".join(s + ".json" for s in bench.stems)})')
    if out is not None:
        os.makedirs(out, exist_ok=True)
        for stem in bench.stems:
            shutil.copy(osp.join(bench.results, stem + '.json'), out)
        for folder in bench.inputs:
            target = osp.join(out, folder)
            if not osp.exists(target):
                os.symlink(osp.join(bench.results, folder), target)
    run(bench, ['--report-only', '--out', out or bench.results])


def _named(table: dict, names: List[str]) -> List[Benchmark]:
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f'unknown benchmark(s) {unknown}; expected one of {sorted(table)} '
                         '(python -m benchmarks list)')
    return [table[n] for n in names]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m benchmarks', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest='command', required=True)
    commands.add_parser('list', help='every benchmark: name, what it measures, its results')
    run_parser = commands.add_parser('run', help='run one benchmark; later arguments are its own')
    run_parser.add_argument('name')
    report_parser = commands.add_parser('report', help='write the pages again from the results')
    report_parser.add_argument('names', nargs='*', help='default: every benchmark with a report')
    report_parser.add_argument('--out', help='a folder for the pages (default: in place)')
    args, rest = parser.parse_known_args(argv)
    table = registry()
    if args.command == 'list':
        width = max(map(len, table))
        for bench in table.values():
            where = osp.relpath(bench.results, osp.dirname(osp.dirname(osp.abspath(__file__))))
            print(f'{bench.name:<{width}}  {bench.about} -> {where}/'
                  f'{",".join(bench.stems)}.*')
    elif args.command == 'run':
        run(_named(table, [args.name])[0], rest)
    else:
        if rest:
            parser.error(f'unrecognized arguments: {" ".join(rest)}')
        chosen = (_named(table, args.names) if args.names else
                  [b for b in table.values() if b.report_only])
        for bench in chosen:
            report(bench, args.out)


if __name__ == '__main__':
    main()
