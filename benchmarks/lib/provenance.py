"""Which code a result came from, for the files that record measurements."""
import os.path as osp
import subprocess

from .version import __version__

CHECKOUT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _git(*args: str) -> str:
    try:
        return subprocess.run(['git', *args], cwd=CHECKOUT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ''


def code_version() -> str:
    """The commit of the checkout this package runs from, ``-dirty`` with uncommitted changes to
    tracked files; for an installed package (no checkout of its own) ``nala-mm <version>``.

    Take it when a run starts: a commit landing during a long run must not be named.
    """
    top = _git('rev-parse', '--show-toplevel')
    # a package installed into a folder that happens to sit inside some git repository (a venv
    # in a checkout) is not that repository's code
    if not top or osp.realpath(top) != osp.realpath(CHECKOUT):
        return f'nala-mm {__version__}'
    commit = _git('rev-parse', '--short', 'HEAD')
    if not commit:
        return f'nala-mm {__version__}'
    return commit + ('-dirty' if _git('status', '--porcelain', '--untracked-files=no') else '')
