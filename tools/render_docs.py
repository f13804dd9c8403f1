"""Write every marked figure and table of README.md, docs/*.md and projects/*/README.md from its
results file.

    python tools/render_docs.py           # rewrite the pages in place (``make docs``)
    python tools/render_docs.py --check   # list the figures that differ from their files; exit 1

A figure is marked in the page's source around the text it renders:
``<!-- fig FILE KEY FORMAT -->91.60<!-- /fig -->``.

* ``FILE``: a file under ``benchmarks/results/``, or a project's from the repository root
  (``projects/NAME/results/...``). A ``.json`` file is read whole. A ``.md`` file
  is its tables, numbered from 1, each a list of rows keyed by the header: ``KEY`` = ``2`` renders
  the second table as it is (``FORMAT``, if given, keeps the rows that contain it), and
  ``2.variant=T.params`` is one cell.
* ``KEY``: a path into the data, steps joined by ``.``: a dict key (``%20`` for a space, ``%2E``
  for a dot), a list index, ``*`` for every value, or ``field=value`` (conditions joined by ``&``)
  for the first list item that has them. Paths joined by ``,`` give a list (``ratio``, ``diff``).
* ``FORMAT``: stages joined by ``|``, applied in turn: names of :data:`TRANSFORMS`, then a Python
  format spec (``.2f``, ``+.2f``, ``,``, ``.1e``, ``d``; ``s`` for text). A list is formatted item
  by item and joined with ``", "``.

Quoting a new figure takes a marker; a new derivation, one entry of :data:`TRANSFORMS`.
"""
import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / 'benchmarks' / 'results'
MARKER = re.compile(r'<!-- fig (?P<spec>[^>]*?) -->(?P<body>.*?)<!-- /fig -->', re.DOTALL)


def _each(fn: Callable[[float], float]) -> Callable[[Any], Any]:
    return lambda v: [fn(x) for x in v] if isinstance(v, list) else fn(v)


TRANSFORMS: Dict[str, Callable[[Any], Any]] = {
    'min': min, 'max': max, 'mean': statistics.mean, 'sum': sum, 'last': lambda v: v[-1],
    'butlast': lambda v: v[:-1], 'ratio': lambda v: v[0] / v[1], 'diff': lambda v: v[0] - v[1],
    'pct': _each(lambda x: 100 * x), 'less': _each(lambda x: 100 - 100 * x), 'gib': _each(
        lambda x: x / 1024), 'sec': _each(lambda x: x / 1000), 'minutes': _each(lambda x: x / 60),
}


def pages() -> List[Path]:
    """The pages that may carry figures: the README, every page under docs/ and each project's
    README."""
    return [REPO / 'README.md', *sorted((REPO / 'docs').rglob('*.md')),
            *sorted((REPO / 'projects').glob('*/README.md'))]


def tables(markdown: str) -> List[str]:
    """The tables of a markdown text, each as its lines."""
    return [m.group(0).strip('\n') for m in re.finditer(r'(?m)(^\|.*\n?)+', markdown)]


def _load(name: str) -> Any:
    shown = name if name.startswith('projects/') else f'benchmarks/results/{name}'
    path = REPO / name if name.startswith('projects/') else RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f'{shown} is quoted but is not committed')
    text = path.read_text(encoding='utf-8')
    if name.endswith('.json'):
        return json.loads(text)
    raw = tables(text)
    cells = [[[c.strip() for c in r.strip('|').split('|')] for r in t.splitlines()] for t in raw]
    return raw, [[dict(zip(t[0], r)) for r in t[2:]] for t in cells]


def _step(value: Any, step: str) -> Any:
    if isinstance(value, list) and re.fullmatch(r'-?\d+', step):
        return value[int(step)]
    if '=' in step:
        wanted = [unquote(c).split('=', 1) for c in step.split('&')]
        return next(item for item in value if all(str(item.get(f)) == v for f, v in wanted))
    return value[unquote(step)]


def _lookup(data: Any, path: str) -> Any:
    values, many = [data], False
    for step in path.split('.'):
        if step == '*':
            values, many = [x for v in values for x in
                            (v.values() if isinstance(v, dict) else v)], True
        else:
            values = [_step(v, step) for v in values]
    return values if many else values[0]


def render(spec: str) -> str:
    """The text a marker ``<!-- fig SPEC -->`` stands for."""
    name, key, fmt = (spec.split() + ['', ''])[:3]
    data = _load(name)
    if name.endswith('.md'):
        raw, data = data
        if key.isdigit():
            head, rule, *rows = raw[int(key) - 1].split('\n')
            return '\n'.join(['', head, rule, *(r for r in rows if unquote(fmt) in r), ''])
        key = re.sub(r'^\d+', lambda m: str(int(m.group(0)) - 1), key)  # tables count from 1
    try:
        value = [_lookup(data, p) for p in key.split(',')] if ',' in key else _lookup(data, key)
        *stages, last = fmt.split('|')
        for stage in stages + ([last] if last in TRANSFORMS else []):
            value = TRANSFORMS[stage](value)
        last = '' if last in TRANSFORMS else last
        return ', '.join(format(v, last) for v in value) if isinstance(value, list) \
            else format(value, last)
    except (KeyError, IndexError, StopIteration, TypeError, ValueError) as err:
        raise KeyError(f'{name}: cannot render {spec!r} ({err!r})') from None


def figures(text: str) -> Iterator[Tuple[re.Match, str]]:  # each marker, and what it renders
    return ((m, render(m.group('spec'))) for m in MARKER.finditer(text))


def rendered(text: str) -> str:
    """The page with every marked figure written from its file."""
    return MARKER.sub(lambda m: f'<!-- fig {m.group("spec")} -->{render(m.group("spec"))}'
                                '<!-- /fig -->', text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--check', action='store_true', help='change nothing; exit 1 on a diff')
    args = parser.parse_args()
    stale = []
    for page in pages():
        text = page.read_text(encoding='utf-8')
        stale += [f'{page.relative_to(REPO)}: {m.group("spec")!r} reads {m.group("body")!r}, '
                  f'its file {want!r}' for m, want in figures(text) if m.group('body') != want]
        if not args.check:
            page.write_text(rendered(text), encoding='utf-8')
    print('\n'.join(stale) or 'every figure reads what its results file gives')
    return 1 if stale and args.check else 0


if __name__ == '__main__':
    sys.exit(main())
