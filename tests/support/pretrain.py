"""Whether mmpretrain's models import here: they need torchvision, which mmpretrain does not
declare, and torchvision's wheels are built for one torch each. The tests of the mmpretrain
classifier skip, naming the reason, where they cannot import: e.g. a CPU build of torch beside
PyPI's CUDA build of the matching torchvision, whose ``import torchvision`` fails (``operator
torchvision::nms does not exist``). tools/check_env.py names the same problem.
(tests/support/side_torchvision.py may make them import for the test run.)
"""
import functools
from typing import Optional

import pytest


@functools.lru_cache(maxsize=None)
def mmpretrain_problem() -> Optional[str]:
    """``None`` when ``mmpretrain.models`` imports; else why not."""
    try:
        import mmpretrain.models  # noqa: F401
    except Exception as error:  # ImportError, or torchvision's RuntimeError
        return (f'mmpretrain.models does not import here ({type(error).__name__}: {error}); '
                'install the torchvision built for this torch (make setup, '
                'tools/check_env.py)')
    return None


requires_mmpretrain = pytest.mark.skipif(mmpretrain_problem() is not None,
                                         reason=mmpretrain_problem() or '')
