"""The pages' figures read what their results files render (``tools/render_docs.py``); any other
measurement-like number (a decimal, or with a unit) is in :data:`NOT_MEASURED` with its reason.
Not swept: code, link targets, versions, sizes (``3×3``), bounds, bare powers of ten (settings)."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'tools'))  # a tool, not the package
import render_docs  # noqa: E402

PAGES = {str(p.relative_to(render_docs.REPO)): p for p in render_docs.pages()}
ARXIV = {'2506.21137': "the paper's arXiv id", '2308.00442': "FLatten Transformer's arXiv id",
         '2312.08874': "Agent Attention's arXiv id", '2412.06590': "InLine attention's arXiv id",
         '2402.04347': "Hedgehog's arXiv id", '2410.10254': "LoLCATs' arXiv id"}
NOT_MEASURED = {
    'docs/user_guides/method.md': {v: "the paper's ImageNet-1K top-1 and GFLOPs (cited on the page)"
                       for v in '79.1 82.6 84.3 85.2 85.7 1.0 2.7 5.1 12.0 18.0'.split()},
    'docs/user_guides/vit.md': {'10': "SETR's stock 10x learning rate on its heads (a setting)"},
    'docs/user_guides/linearize.md': {'90': "the issue's goal for the zero-shot mIoU (a target)"},
    'docs/user_guides/swap.md': {v: 'ADE20K mIoU / COCO AP of Swin-T, FLatten-Swin-T and '
                                    'Agent-Swin-T as their papers report them (cited on the page)'
                                 for v in '44.51 44.82 46.68 43.7 39.8 44.2 40.2 44.6 40.7'.split()
                                 },
    'docs/user_guides/vitdet.md': dict.fromkeys(('51.6', '45.9'),
                                                "ViTDet-B's COCO AP, detectron2's zoo"),
    'docs/user_guides/getting_started.md': {
        '17.6': "DeiT-B's GFLOPs, as the DeiT paper reports them (cited with its training time)",
        '0.7': 'an estimate from DeiT-B\'s cost scaled by GFLOPs (stated as one on the page)'},
}
CODE = re.compile(r'`[^`]*`|\]\([^)]*\)')  # inline code, link targets
VERSION = re.compile(r'(?<![\w.])\d+\.\d+\.\d+(?![\w.])')
NUMBER = re.compile(r'(?<![\w.])(\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)'
                    r'(\s?(?:×(?!\d)|%|ms\b|MiB\b|GiB\b|min\b|s\b))?')
BOUND = re.compile(r'[<>≤≥]\s?$')


def prose(text: str) -> list:
    """The page's lines with figures, comments, code and link targets blanked."""
    text = render_docs.MARKER.sub(lambda m: re.sub(r'[^\n]', ' ', m.group(0)), text)
    lines, fenced = [], False
    for line in text.split('\n'):
        if line.lstrip().startswith('```'):
            fenced, line = not fenced, ''
        elif fenced or line.startswith('    ') or line.lstrip().startswith('<!--'):
            line = ''
        lines.append(CODE.sub(lambda m: ' ' * len(m.group(0)), line.replace('**', '')))
    return lines


def unmarked_measurements(text: str) -> list:
    """``(line number, number, context)`` of each measurement-like number outside a figure."""
    found = []
    for i, line in enumerate(prose(text), 1):
        versions = {m.start() for m in VERSION.finditer(line)}
        for m in NUMBER.finditer(line):
            number, unit = m.group(1).rstrip(','), m.group(2)
            if m.start() in versions or not ('.' in number or 'e' in number or unit) or \
                    re.fullmatch(r'1e[-+]?\d+', number) or BOUND.search(line[:m.start()]):
                continue
            found.append((i, number, ' '.join(line[max(0, m.start() - 40):m.end() + 20].split())))
    return found


@pytest.mark.parametrize('page', PAGES)
def test_every_figure_reads_what_its_file_renders(page):
    text = PAGES[page].read_text(encoding='utf-8')
    stale = [f'{m.group("spec")!r}: the page reads {m.group("body")!r}, the file gives {want!r}'
             for m, want in render_docs.figures(text) if m.group('body') != want]
    assert not stale, f'{page} (run `make docs`):\n  ' + '\n  '.join(stale)


@pytest.mark.parametrize('page', PAGES)
def test_every_measurement_on_a_page_is_a_figure(page):
    allowed = {**ARXIV, **NOT_MEASURED.get(page, {})}
    loose = [f'line {i}: {number!r} in ...{context}...'
             for i, number, context in unmarked_measurements(PAGES[page].read_text('utf-8'))
             if number not in allowed]
    assert not loose, (f'{page} states numbers that no results file backs (mark them as figures, '
                       'or list them in NOT_MEASURED with the reason):\n  ' + '\n  '.join(loose))


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(render_docs, 'RESULTS', tmp_path)
    (tmp_path / 'run.json').write_text('{"rows": [{"side": 512, "ms": 1500.0, "mib": 3072.0},'
                                       ' {"side": 1024, "ms": 6000.0, "mib": 9216.0}]}')
    (tmp_path / 'run.md').write_text('title\n\n| side | ms |\n|---|---|\n| 512 | 1500 |\n')
    return tmp_path


def test_the_renderer_catches_edits_stale_files_and_missing_files(results):
    page = ('<!-- fig run.json rows.side=1024.ms sec|.1f -->6.0<!-- /fig --> s, '
            '<!-- fig run.json rows.*.mib gib|max|.0f -->9<!-- /fig --> GiB, '
            '<!-- fig run.json rows.1.ms,rows.0.ms ratio|.2f -->4.00<!-- /fig -->×, '
            '<!-- fig run.md 1.side=512.ms s -->1500<!-- /fig -->\n'
            '<!-- fig run.md 1 -->\n| side | ms |\n|---|---|\n| 512 | 1500 |\n<!-- /fig -->')
    assert render_docs.rendered(page) == page
    edited = page.replace('>6.0<', '>5.9<')
    assert [m.group('body') for m, want in render_docs.figures(edited)
            if m.group('body') != want] == ['5.9']
    assert render_docs.rendered(edited) == page
    (results / 'run.json').write_text((results / 'run.json').read_text().replace('6000.0', '6500'))
    assert next(render_docs.figures(page))[1] == '6.5'
    (results / 'run.json').unlink()
    with pytest.raises(FileNotFoundError, match='run.json is quoted but is not committed'):
        list(render_docs.figures(page))
    with pytest.raises(KeyError, match="run.md: cannot render 'run.md 1.side=2048.ms s'"):
        render_docs.render('run.md 1.side=2048.ms s')
    with pytest.raises(KeyError, match="cannot render 'run.md 1.0.ms pctt|.1f'"):
        render_docs.render('run.md 1.0.ms pctt|.1f')  # a misspelt transform


def test_a_number_outside_a_figure_is_swept():
    text = ('took 35 min, `--lr 0.5`, 1.2.2, ≤ 0.7, 3×3, 1e-4, '
            '<!-- fig a.json k .2f -->0.63<!-- /fig -->')
    assert [n for _, n, _ in unmarked_measurements(text)] == ['35']
