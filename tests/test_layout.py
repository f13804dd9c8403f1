"""What the layout promises: tools (scripts), benchmarks and projects (modules) run over the
package with no sys.path edits, the package imports nothing from tools/, benchmarks/, projects/
or tests/, tools and tests import nothing from benchmarks/, the released-op transcription imports
nothing it checks. (That every benchmark is declared to the runner: benchmarks/tests/.)"""
import ast

import pytest

from tests.helpers import REPO


def _python_files(folder):
    return sorted((REPO / folder).rglob('*.py'))


@pytest.mark.parametrize('folder', ['tools', 'benchmarks', 'projects'])
def test_scripts_do_not_edit_sys_path(folder):
    offenders = []
    for path in _python_files(folder):
        for node in ast.walk(ast.parse(path.read_text())):
            # sys.path.insert(...), sys.path.append(...), sys.path = ..., sys.path += ...
            target = node.func.value if isinstance(node, ast.Call) and isinstance(
                node.func, ast.Attribute) else None
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AugAssign) else []
            for t in [target, *targets]:
                if isinstance(t, ast.Attribute) and t.attr == 'path' and \
                        isinstance(t.value, ast.Name) and t.value.id == 'sys':
                    offenders.append(f'{path.relative_to(REPO)}:{node.lineno}')
    assert _python_files(folder) and offenders == []


def _imported_modules(path):
    """The absolute imports of a file: ``import a.b`` and ``from a.b import c`` give ``a.b``."""
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.append(node.module or '')
    return modules


def test_the_package_imports_nothing_from_tools_benchmarks_projects_or_tests():
    offenders = [f'{path.relative_to(REPO)}: {m}' for path in _python_files('nala_mm')
                 for m in _imported_modules(path)
                 if m.split('.')[0] in ('tools', 'benchmarks', 'projects', 'tests')]
    assert offenders == []


@pytest.mark.parametrize('folder', ['tools', 'tests'])
def test_tools_and_tests_import_nothing_from_benchmarks(folder):
    """Benchmarks run over the package: what a tool or a test needs lives in nala_mm (or, for a
    test, in tests/). A helper only the benchmarks use lives in benchmarks/lib/ and its test
    beside it, in benchmarks/tests/ (pytest.ini's testpaths; the recompile counts, #54), which
    may import from benchmarks/ and from tests/, as projects/*/tests may."""
    offenders = [f'{path.relative_to(REPO)}: {m}' for path in _python_files(folder)
                 for m in _imported_modules(path) if m.split('.')[0] == 'benchmarks']
    assert offenders == []


def test_the_released_op_transcription_imports_only_torch():
    """The parity tests hold the fast path to tests/reference/released_op.py (and the benchmarks
    time it against it): it must not import the code it checks."""
    modules = _imported_modules(REPO / 'tests' / 'reference' / 'released_op.py')
    assert modules and {m.split('.')[0] for m in modules} <= {'typing', 'torch'}
