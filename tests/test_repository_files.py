"""The files users expect beside the code: the license setup.py names, how to cite, what
changed."""
import hashlib
import re
import subprocess

import yaml

import nala_mm
from tests.helpers import REPO


def test_license_is_the_apache_2_0_text():
    text = (REPO / 'LICENSE').read_text()
    # the canonical https://www.apache.org/licenses/LICENSE-2.0.txt, byte for byte
    assert hashlib.md5(text.encode()).hexdigest() == '3b83ef96387f14655fc854ddc3c6bd57'
    assert "license='Apache-2.0'" in (REPO / 'setup.py').read_text()


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


def test_changelog_covers_every_issue_the_history_names():
    """Each wave of work is an issue; the commits name it as (#N)."""
    changelog = (REPO / 'CHANGELOG.md').read_text()
    assert f'## {nala_mm.__version__}' in changelog
    subjects = subprocess.run(['git', 'log', '--format=%s'], cwd=REPO, capture_output=True,
                              text=True).stdout
    issues = set(re.findall(r'#\d+', subjects))
    assert issues, 'no commit subject names an issue: is this a shallow clone?'
    missing = sorted(i for i in issues if not re.search(rf'{i}\b', changelog))
    assert not missing, f'CHANGELOG.md says nothing of {missing}'


def test_the_mim_links_of_a_checkout_are_ignored_by_git():
    ignored = subprocess.run(['git', 'check-ignore', 'nala_mm/.mim/configs', 'dist/x', 'build/x'],
                             cwd=REPO, capture_output=True, text=True).stdout.split()
    assert ignored == ['nala_mm/.mim/configs', 'dist/x', 'build/x']
