"""The README says which results files record the commit they ran on: exactly those that do."""
import json
import re

from tests.helpers import REPO


def test_the_readme_names_exactly_the_results_files_that_record_their_commit():
    readme = (REPO / 'README.md').read_text()
    match = re.search(r'Files recording the commit\s+they ran on \(([^)]*)\)', readme)
    assert match, 'the Results section no longer says which files record their commit'
    named = set(re.findall(r'`([\w.-]+\.json)`', match.group(1)))
    recording = set()
    for path in sorted((REPO / 'benchmarks' / 'results').glob('*.json')):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and re.fullmatch(r'[0-9a-f]{7,40}(-dirty)?',
                                                   str(data.get('commit', ''))):
            recording.add(path.name)
    assert named == recording, f'README names {sorted(named)}; recording: {sorted(recording)}'
