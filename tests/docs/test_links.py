"""The README stays short, and the links between the pages, the results files and the code's
citations of docs sections resolve."""
import os
import os.path as osp
import re
from typing import List

import pytest

from tests.helpers import REPO

PAGES = ['README.md'] + sorted(str(p.relative_to(REPO)) for pages in (
    (REPO / 'docs').rglob('*.md'), (REPO / 'projects').glob('*/README.md')) for p in pages)


def source(page: str) -> str:
    return (REPO / page).read_text(encoding='utf-8')


def headings(path: str) -> List[str]:
    """The headings of a markdown file (outside fenced code)."""
    found, fenced = [], False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if line.lstrip().startswith('```'):
                fenced = not fenced
            elif not fenced and line.startswith('#'):
                found.append(line.lstrip('#').strip())
    return found


def heading_anchors(path: str) -> set:
    """GitHub's anchors of a markdown file's headings."""
    return {re.sub(r'[^\w\- ]', '', h.lower()).replace(' ', '-') for h in headings(path)}


@pytest.mark.parametrize('page', PAGES)
def test_relative_links_resolve(page):
    """Links between the README, the docs and the results files point at files and headings
    that exist (the code's docstrings cite docs/user_guides/method.md's headings too)."""
    targets = re.findall(r'\]\(([^)\s]+)\)', source(page))
    broken = []
    for target in targets:
        if re.match(r'[a-z]+://', target):
            continue
        path, _, anchor = target.partition('#')
        resolved = osp.normpath(osp.join(REPO, osp.dirname(page), path)) if path else \
            osp.join(REPO, page)
        if not osp.exists(resolved) or (anchor and anchor not in heading_anchors(resolved)):
            broken.append(target)
    assert not broken, f'{page}: broken links {broken}'


QUOTED = r'"[^"]+"|\'[^\']+\''  # a double-quoted name may hold an apostrophe
CITATION = re.compile(rf'docs/((?:\w+/)*\w+)\.md\s*[,(]\s*(?:see\s+)?((?:(?:{QUOTED})\s*,?\s*)+)')


def test_sections_the_code_cites_exist():
    """Docstrings and comments point at docs sections by heading
    (``docs/user_guides/method.md, "Cubed keys"``): each cited heading exists, so renaming one
    breaks this test, not the pointer."""
    missing = []
    for folder in ('nala_mm', 'tools', 'benchmarks', 'configs'):
        for root, _, files in os.walk(osp.join(REPO, folder)):
            for name in files:
                if not name.endswith(('.py', '.sh')):
                    continue
                with open(osp.join(root, name), encoding='utf-8') as f:
                    code = ' '.join(re.sub(r'\n\s*#\s*', ' ', f.read()).split())
                for page, names in CITATION.findall(code):
                    path = osp.join(REPO, 'docs', f'{page}.md')
                    titles = {h.lower() for h in headings(path)} if osp.exists(path) else set()
                    missing += [f'{osp.relpath(osp.join(root, name), REPO)}: docs/{page}.md '
                                f'"{cited[1:-1]}"' for cited in re.findall(QUOTED, names)
                                if cited[1:-1].lower() not in titles]
    assert not missing, 'cited docs sections that do not exist:\n  ' + '\n  '.join(missing)
