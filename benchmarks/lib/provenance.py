"""Which code a result came from, for the results files the benchmarks write."""
import subprocess

from nala_mm import __version__

from .paths import REPO


def _git(*args: str) -> str:
    try:
        return subprocess.run(['git', *args], cwd=REPO, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ''


def code_version() -> str:
    """The commit of this checkout, ``-dirty`` with uncommitted changes to tracked files; outside
    a git checkout (an exported tree) ``nala-mm <version>``.

    Take it when a run starts: a commit landing during a long run must not be named.
    """
    commit = _git('rev-parse', '--short', 'HEAD')
    if not commit:
        return f'nala-mm {__version__}'
    return commit + ('-dirty' if _git('status', '--porcelain', '--untracked-files=no') else '')
