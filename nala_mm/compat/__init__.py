"""Opt-in changes to mmengine and torch, and what the project's tools do instead of changing the
hosts.

``import nala_mm`` registers the project's modules and changes nothing else, and neither does
``import nala_mm.compat``. The project's tools call :func:`install` (idempotent); a config opts
in with ``custom_imports=dict(imports=['nala_mm', 'nala_mm.compat.enable'])`` (a config can only
import: :mod:`nala_mm.compat.enable` installs on import); code that needs the changes for a while
uses ``with installed():``, which undoes each change on exit (the tests do).

:func:`install` makes three changes, one module each (the module's docstring says why and which
upstream versions need it):

==========================================  ===================================================
what changes                                module
==========================================  ===================================================
``HistoryBuffer`` pickles its data only     :mod:`~nala_mm.compat.history_buffer`
(a ``copyreg`` reducer; the class is        (Runner checkpoints under weights-only loading,
untouched)                                  mmengine 0.10.7, torch >= 2.6)
torch's weights-only allow-list gains the   :mod:`~nala_mm.compat.safe_globals`
buffer's rebuild function, numpy's          (mmengine 0.10.7 calls ``torch.load`` without
array/scalar/dtype reconstructors and       ``weights_only``: torch >= 2.6 loads weights-only)
``argparse.Namespace``
mmengine's file backends gain               :mod:`~nala_mm.compat.atomic_checkpoints`
``nala_atomic_local`` (a new name; ``local`` (no mmengine version writes atomically)
is mmengine's and stays as it is)
==========================================  ===================================================

Plain checkpoint paths keep mmengine's loader (scheme ``''``): it loads weights-only on torch
>= 2.6, and the allow-list above is all a Runner checkpoint needs. Where the hosts would have to be
patched, the project's tools act on their own config and runner instead (:func:`build_runner`):

* the checkpoint hook writes through ``nala_atomic_local``
  (:func:`~nala_mm.compat.atomic_checkpoints.select_atomic_checkpoints`);
* the data the run reads is checked before the Runner is built, and a COCO file mmdet failed on
  is named with what is wrong (:mod:`nala_mm.datasets.checks`);
* under ``torchrun`` without CUDA the tools start the gloo process group, which the Runner then
  uses (:mod:`~nala_mm.compat.cpu_torchrun`);
* ``tools/train.py --compile`` runs the optimizer update of the run's wrapper eager, through a
  hook ``import nala_mm.compat`` registers, ``EagerOptimizerUpdatesHook``
  (:mod:`~nala_mm.compat.eager_updates`).

Checkpoints saved by a run without these changes hold ``HistoryBuffer``'s default pickle and are
refused under weights-only loading: load such a file once with weights-only loading turned off
(only if you trust it) and re-save it from a run with :func:`install` in effect.
"""
import contextlib
from typing import Callable, Iterator, List, Sequence

from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..datasets.checks import check_data
from . import (
    atomic_checkpoints,
    eager_updates,  # noqa: F401  (registers EagerOptimizerUpdatesHook)
    history_buffer,
    safe_globals,
)
from .atomic_checkpoints import select_atomic_checkpoints
from .cpu_torchrun import init_cpu_process_group

_CHANGES = (history_buffer, safe_globals, atomic_checkpoints)
# the undo functions of the process-wide install(); empty while it has not run
_installed: List[Callable[[], None]] = []


def _apply() -> List[Callable[[], None]]:
    return [change.apply() for change in _CHANGES]


def install() -> None:
    """Make every change of the module docstring for the rest of the process; a second call
    changes nothing."""
    if not _installed:
        _installed.extend(_apply())


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The changes of :func:`install` inside the block, each undone on exit (unless
    :func:`install` made them for the process, which stays so)."""
    if _installed:
        yield
        return
    undo = _apply()
    try:
        yield
    finally:
        for change in reversed(undo):
            change()


def build_runner(cfg: Config, loaders: Sequence[str]) -> Runner:
    """The tools' Runner: ``cfg``'s ``loaders`` (e.g. ``'train_dataloader'``) checked, its
    checkpoints written atomically, the CPU process group started under ``torchrun``."""
    check_data(cfg, loaders)
    select_atomic_checkpoints(cfg)
    init_cpu_process_group(cfg)
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
