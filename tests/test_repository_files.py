"""The files users expect beside the code: how to cite it, and a checkout's generated links kept
out of git."""
import subprocess

import yaml

import nala_mm
from tests.helpers import REPO


def test_citation_cites_the_paper_and_this_project():
    cff = yaml.safe_load((REPO / 'CITATION.cff').read_text())
    assert cff['cff-version'] == '1.2.0' and cff['type'] == 'software'
    assert cff['version'] == nala_mm.__version__ and cff['license'] == 'Apache-2.0'
    paper = cff['preferred-citation']
    assert paper['title'] == 'Norm×Direction: Restoring the Missing Query Norm in Vision Linear ' \
                             'Attention'
    assert paper['title'].split(':')[0] in (REPO / 'README.md').read_text()
    assert paper['year'] == 2026 and paper['authors'][0]['family-names'] == 'Meng'
    assert any(i['value'] == 'arXiv:2506.21137' for i in paper['identifiers'])
    assert all({'family-names', 'given-names'} <= set(a) for a in paper['authors'])


def test_the_mim_links_of_a_checkout_are_ignored_by_git():
    ignored = subprocess.run(['git', 'check-ignore', 'nala_mm/.mim/configs', 'dist/x', 'build/x'],
                             cwd=REPO, capture_output=True, text=True).stdout.split()
    assert ignored == ['nala_mm/.mim/configs', 'dist/x', 'build/x']
