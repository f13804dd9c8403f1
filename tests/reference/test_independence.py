"""The test oracle's independence: the released-op transcription imports only torch, never the
code it checks. (The import rules between folders are ruff's: TID251 in each folder's
ruff.toml.)"""
import ast

from tests.helpers import REPO


def test_the_released_op_transcription_imports_only_torch():
    """The parity tests hold the fast path to tests/reference/released_op.py (and the benchmarks
    time it against it): it must not import the code it checks."""
    tree = ast.parse((REPO / 'tests' / 'reference' / 'released_op.py').read_text())
    modules = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names]
    modules += [node.module or '.' for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)]
    assert modules and {m.split('.')[0] for m in modules} <= {'typing', 'torch'}, modules
