"""Opt-in changes to mmengine, mmseg, mmdet and torch that the project's tools and configs use.

``import nala_mm`` registers the project's modules and changes nothing else. Importing this module
(``custom_imports=dict(imports=['nala_mm', 'nala_mm.compat'])`` in a config: a config can only
import) or calling :func:`install` (idempotent, for code) makes the following changes:

========================================  ==================================================
what changes                              why
========================================  ==================================================
torch's weights-only allow-list gains     Runner checkpoints load under torch's default
mmengine's ``HistoryBuffer`` and numpy's  weights-only unpickling: mmengine 0.10.7 calls
array/scalar/dtype reconstructors         ``torch.load`` without ``weights_only`` (the message
                                          hub's buffers and logged numpy values are the only
                                          non-tensor types a Runner checkpoint holds)
and ``argparse.Namespace``                the authors' DeiT-style training files hold their
                                          command line as a Namespace (``'args'``), beside the
                                          weights: a plain attribute holder, no code to run
``HistoryBuffer.__getstate__`` /          a buffer pickles only its data; by default it drags
``__setstate__``                          in functions through ``builtins.getattr``, which must
                                          never be allow-listed
mmengine's local checkpoint loader        weights-only ``torch.load`` whose errors name the file
(``CheckpointLoader`` scheme ``''``)      and the refused object (the one registration with
                                          ``force=True`` in the package: it replaces a scheme)
``mmengine.fileio.LocalBackend.put``      atomic writes (temporary file, fsync, rename): a kill
                                          while saving never leaves a truncated checkpoint
``mmengine.dist.utils._init_dist_pytorch``  ``torchrun`` on CPU (gloo): it skips
                                          ``torch.cuda.set_device`` without CUDA
``load_data_list`` of mmseg's             a missing folder or a malformed COCO file is named
``BaseSegDataset`` and mmdet's            with what is expected; valid data takes the
``CocoDataset``                           original path unchanged
``OptimWrapper.update_params`` runs       mmengine's ``compile=True`` compiles the whole
outside ``torch.compile`` graphs          ``train_step``; traced, the optimizer step fails on
                                          mmengine's param groups and would recompile at every
                                          learning-rate change (:mod:`nala_mm.compile`)
========================================  ==================================================

Checkpoints saved by a run without these changes hold ``HistoryBuffer``'s default pickle and may
be refused under weights-only loading: load such a file once with weights-only loading turned off
(only if you trust it) and re-save it from a run with this module installed.
"""
import argparse

import torch
from mmengine.dist import utils as dist_utils
from mmengine.fileio.backends import LocalBackend
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

from .checkpoint_safety import (
    atomic_put,
    history_getstate,
    history_setstate,
    load_from_local,
    numpy_safe_globals,
)
from .compile import eager_optimizer_updates
from .datasets.checks import install_dataset_checks
from .distributed import cpu_aware_pytorch_launcher


def install() -> None:
    """Make every change listed in the module docstring; a second call changes nothing."""
    HistoryBuffer.__getstate__ = history_getstate
    HistoryBuffer.__setstate__ = history_setstate
    safe = torch.serialization.get_safe_globals()
    missing = [g for g in (HistoryBuffer, argparse.Namespace, *numpy_safe_globals())
               if g not in safe]
    if missing:  # torch keeps them in a set: even an empty addition may reorder its listing
        torch.serialization.add_safe_globals(missing)
    if CheckpointLoader._schemes.get('') is not load_from_local:
        CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
    LocalBackend.put = atomic_put
    if not getattr(dist_utils._init_dist_pytorch, 'nala_cpu_aware', False):
        dist_utils._init_dist_pytorch = cpu_aware_pytorch_launcher(dist_utils._init_dist_pytorch)
    install_dataset_checks()
    eager_optimizer_updates()


install()
