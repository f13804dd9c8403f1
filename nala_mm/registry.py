"""Where the project's modules are registered.

Scope-neutral modules (the backbone, the token mixers) go into mmengine's root ``MODELS``: mmseg's
and mmdet's registries are its children and find an unscoped ``type`` there under either default
scope, and in the upstream tools. A subclass of an mmseg or mmdet class belongs to that package's
own registry (``scope='mmseg'`` / ``'mmdet'``). Registration never uses ``force=True``: a second
module under a registered name raises and names both.
"""
import importlib
from typing import Optional, Type

from mmengine.registry import MODELS as ROOT_MODELS
from mmengine.registry import Registry


def models_registry(scope: Optional[str] = None) -> Registry:
    """mmengine's root ``MODELS`` (``scope=None``) or the ``MODELS`` of package ``scope``."""
    if scope is None:
        return ROOT_MODELS
    return importlib.import_module(f'{scope}.registry').MODELS


def register_model(cls: Optional[Type] = None, *, scope: Optional[str] = None,
                   name: Optional[str] = None):
    """Class decorator: register ``cls`` in :func:`models_registry` under ``name`` (default:
    the class's own name).

    ``@register_model``, ``@register_model(scope='mmseg')``, or with ``name=`` where one module
    defines a subclass of mmseg's and of mmdet's class that configs call by the same name.
    """

    def register(target: Type) -> Type:
        registry = models_registry(scope)
        key = name or target.__name__
        existing = registry.module_dict.get(key)
        if existing is not None:
            raise KeyError(f'{key} is already registered in {registry.scope}::'
                           f'{registry.name} by {existing.__module__}.{existing.__qualname__}; '
                           f'refusing to replace it with {target.__module__}.'
                           f'{target.__qualname__}')
        registry.register_module(name=key, module=target)
        return target

    return register(cls) if cls is not None else register
