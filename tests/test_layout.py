"""What the layout promises: tools and benchmarks are scripts over the package (no sys.path
edits), and the package imports nothing from tools/, benchmarks/ or tests/."""
import ast

import pytest

from tests.helpers import REPO


def _python_files(folder):
    return sorted((REPO / folder).rglob('*.py'))


@pytest.mark.parametrize('folder', ['tools', 'benchmarks'])
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


def test_the_package_imports_nothing_from_tools_benchmarks_or_tests():
    offenders = []
    for path in _python_files('nala_mm'):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ''] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            offenders += [f'{path.relative_to(REPO)}: {n}' for n in names
                          if n.split('.')[0] in ('tools', 'benchmarks', 'tests')]
    assert offenders == []
