"""Register nala_mm modules where every OpenMMLab config can find them.

mmengine's root ``MODELS`` serves any scope; mmseg's and mmdet's own registries are filled too so
``dict(type='NaLaFormer')`` resolves directly under ``default_scope='mmseg'`` or ``'mmdet'`` and in
the upstream tools' listings.
"""
import importlib
from typing import List, Type

from mmengine.registry import MODELS as ENGINE_MODELS


def _downstream_model_registries() -> List:
    registries = []
    for package in ('mmseg', 'mmdet'):
        try:
            registries.append(importlib.import_module(f'{package}.registry').MODELS)
        except ImportError:  # the package is optional for users of only one task
            continue
    return registries


def register_model(cls: Type) -> Type:
    """Class decorator: register ``cls`` under its own name in every available MODELS."""
    for registry in [ENGINE_MODELS, *_downstream_model_registries()]:
        registry.register_module(module=cls, force=True)
    return cls
