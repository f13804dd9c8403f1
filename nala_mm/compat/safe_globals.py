"""Runner checkpoints under torch's weights-only unpickling (the default since torch 2.6).

mmengine 0.10.7 calls ``torch.load`` without ``weights_only``, so on torch >= 2.6 resuming from a
Runner checkpoint fails on the few non-tensor types the Runner saves. Instead of switching
weights-only loading off, :mod:`nala_mm.compat` installs what this module defines:

* allow-lists exactly those types: mmengine's ``HistoryBuffer`` (in the message hub) and the
  numpy array/scalar/dtype reconstructors its logged values use;
* makes ``HistoryBuffer`` pickle only its data: by default it drags in its statistics-method
  table, which pickles functions through ``builtins.getattr``; allow-listing ``getattr`` would
  reopen arbitrary code execution, so that table is simply not saved (it is class-level anyway);
* routes local checkpoint files through a loader that names the file and says why when a load
  is refused (foreign pickled object) or impossible (truncated / not a checkpoint);
* writes local files atomically (temporary file, fsync, rename): a process killed while saving
  leaves the previous checkpoint intact and never a truncated file under the final name
  (mmengine writes ``last_checkpoint`` only after the checkpoint itself).
"""
import os
import os.path as osp
import pickle
import zipfile
from typing import Any, Dict, List

import numpy as np
import torch
from mmengine.fileio.backends import LocalBackend
from mmengine.logging.history_buffer import HistoryBuffer

# The data a HistoryBuffer needs to be rebuilt; everything else is derived or class-level.
_HISTORY_FIELDS = ('max_length', '_log_history', '_count_history')


class CheckpointRefusedError(pickle.UnpicklingError):
    """A checkpoint holds an object outside the weights-only allow-list."""


def history_getstate(self: HistoryBuffer) -> Dict[str, Any]:
    return {name: getattr(self, name) for name in _HISTORY_FIELDS}


def history_setstate(self: HistoryBuffer, state: Dict[str, Any]) -> None:
    for name in _HISTORY_FIELDS:
        setattr(self, name, state[name])
    self._set_default_statistics()


def numpy_safe_globals() -> List[Any]:
    dtypes = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32,
              np.uint64, np.float16, np.float32, np.float64]
    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype,
            *(type(np.dtype(t)) for t in dtypes)]


def load_from_local(filename: str, map_location=None) -> Any:
    """Weights-only ``torch.load`` of a local file with errors that name the file."""
    path = osp.expanduser(filename)
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint {filename} does not exist')
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        # torch names a refused type as "GLOBAL module.name" in its message; anything else
        # from the unpickler means the bytes are not a pickle it understands.
        detail = next((line.strip() for line in str(err).split('\n')
                       if 'GLOBAL' in line), None)
        if detail is None:
            raise ValueError(f'checkpoint {path} is corrupt or not a PyTorch checkpoint '
                             f'({str(err).splitlines()[-1] if str(err) else err!r})') from err
        raise CheckpointRefusedError(
            f'refusing to load checkpoint {path}: it holds an object outside the weights-only '
            f'allow-list ({detail}). Loading it could run arbitrary code. If you trust the file, '
            f'load it yourself with torch.load and weights-only loading turned off, and re-save '
            f'its tensors.'
        ) from err
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise ValueError(f'checkpoint {path} is truncated or not a PyTorch checkpoint '
                         f'({type(err).__name__}: {err})') from err


def atomic_put(self: LocalBackend, obj: bytes, filepath) -> None:
    """``LocalBackend.put`` that never leaves a partly written file under ``filepath``."""
    filepath = os.fspath(filepath)
    os.makedirs(osp.dirname(filepath) or '.', exist_ok=True)
    partial = f'{filepath}.partial-{os.getpid()}'
    try:
        with open(partial, 'wb') as f:
            f.write(obj)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, filepath)
    finally:
        if osp.exists(partial):
            os.remove(partial)
