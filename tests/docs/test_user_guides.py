"""User guides carry no status and no history: no commit hash, issue number, date or "not
measured yet" on a page of docs/user_guides/ (measurements and what is unmeasured belong to
docs/reports/; history to the CHANGELOG and the commit messages)."""
import re

import pytest

from tests.helpers import REPO

GUIDES = sorted((REPO / 'docs' / 'user_guides').glob('*.md'))
MONTHS = ('January|February|March|April|May|June|July|August|September|October|November|'
          'December')
# a hex word with a letter and a digit (a commit), '#N' outside a link anchor, an ISO or
# written-out date, the wording of status
STATUS = {
    'commit hash': re.compile(r'\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b'),
    'issue number': re.compile(r'(?<![\w/\]])#\d+\b'),
    'date': re.compile(rf'\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b(?:{MONTHS}) (?:\d{{1,2}}, )?\d{{4}}\b'),
    'status': re.compile(r'not (?:yet )?measured yet|no GPU yet', re.I),
}


def status_lines(text: str) -> list:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = re.sub(r'<!-- fig .*?-->', '', line)  # a figure marker's key is a results path
        found += [f'{number}: {kind}: {m.group(0)!r}' for kind, pattern in STATUS.items()
                  for m in pattern.finditer(line)]
    return found


@pytest.mark.parametrize('page', GUIDES, ids=lambda p: p.name)
def test_a_user_guide_holds_no_status_or_history(page):
    assert GUIDES and not status_lines(page.read_text(encoding='utf-8'))


@pytest.mark.parametrize('line', ['fixed in 3f2a9c1', 'as #54 asks', 'on 2026-12-08',
                                  'measured in December 2026', 'GPU: not measured yet'])
def test_the_check_catches_each_kind(line):
    assert status_lines(line)


def test_the_check_leaves_links_citations_and_file_names_alone():
    assert not status_lines('[link](speed.md#block-and-backbone), ICML 2026, arXiv:2506.21137, '
                            'val2017/000000000139.jpg, 1024² at 4,096 tokens')
