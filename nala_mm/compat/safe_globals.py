"""torch's weights-only allow-list gains exactly the non-tensor types a Runner checkpoint holds.

Why: since torch 2.6 ``torch.load`` unpickles weights-only by default, and mmengine 0.10.7 calls it
without ``weights_only`` (``CheckpointLoader``'s local loader, used by ``--resume`` and
``load_from``), so resuming a Runner checkpoint fails on what the Runner saves besides tensors:
the message hub's buffers (rebuilt by :func:`~nala_mm.compat.history_buffer.rebuild_history_buffer`)
and the numpy arrays, scalars and dtypes of logged values. Also ``argparse.Namespace``: the
authors' DeiT-style training files hold their command line as one (``'args'``), a plain attribute
holder with no code to run. Weights-only loading stays on: a file carrying any other pickled
object is refused by torch. Needed with mmengine 0.10.7 under torch >= 2.6.
"""
import argparse
from typing import Any, Callable, List

import numpy as np
import torch

from .history_buffer import rebuild_history_buffer


def numpy_safe_globals() -> List[Any]:
    dtypes = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32,
              np.uint64, np.float16, np.float32, np.float64]
    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype,
            *(type(np.dtype(t)) for t in dtypes)]


def safe_globals() -> List[Any]:
    """What this change allow-lists."""
    return [rebuild_history_buffer, argparse.Namespace, *numpy_safe_globals()]


def apply() -> Callable[[], None]:
    """Make the change; returns what undoes it (it removes only what it added)."""
    present = torch.serialization.get_safe_globals()
    added = [g for g in safe_globals() if g not in present]
    if added:  # torch keeps them in a set: even an empty addition may reorder its listing
        torch.serialization.add_safe_globals(added)

    def undo() -> None:
        if not added:
            return
        # torch has no removal: keep everything else (torch allow-lists types of its own as
        # its submodules are first imported, meanwhile too)
        kept = [g for g in torch.serialization.get_safe_globals() if g not in added]
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(kept)
    return undo
