"""Atomic checkpoint writes: a file backend of the project's own name, ``nala_atomic_local``.

Why: mmengine's ``LocalBackend`` (0.10.7) writes a checkpoint straight to its final name, so a
process killed while saving leaves a truncated file there (and ``last_checkpoint``, written after
it, may name it). :class:`AtomicLocalBackend` writes to a temporary file, fsyncs and renames. It
is registered under a new name (mmengine owns ``local``; replacing it would take
``force=True``), and the project's tools select it for the checkpoint hook
(:func:`select_atomic_checkpoints`, ``default_hooks.checkpoint.backend_args``). Any mmengine
version: none writes atomically.
"""
import os
import os.path as osp
from typing import Callable

from mmengine.config import Config
from mmengine.fileio import register_backend
from mmengine.fileio.backends import LocalBackend, registry_utils

BACKEND = 'nala_atomic_local'


class AtomicLocalBackend(LocalBackend):
    """mmengine's ``LocalBackend`` whose writes never leave a partly written file."""

    def put(self, obj: bytes, filepath) -> None:
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

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        # last_checkpoint: it names the newest complete checkpoint, or the previous one
        self.put(obj.encode(encoding), filepath)


def select_atomic_checkpoints(cfg: Config) -> None:
    """The config's checkpoint hook writes through :class:`AtomicLocalBackend`, unless the
    config chose a backend of its own (``s3://`` and the like are left alone)."""
    hook = cfg.get('default_hooks', {}).get('checkpoint')
    if isinstance(hook, dict) and hook.get('backend_args') is None and \
            '://' not in str(hook.get('out_dir') or ''):
        hook['backend_args'] = dict(backend=BACKEND)


def apply() -> Callable[[], None]:
    """Register the backend; returns what unregisters it."""
    if BACKEND in registry_utils.backends:
        return lambda: None
    register_backend(BACKEND, AtomicLocalBackend)
    return lambda: registry_utils.backends.pop(BACKEND, None)
