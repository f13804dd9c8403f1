"""Where the project's modules are registered.

Scope-neutral modules (the backbone, the token mixers) go into mmengine's root ``MODELS``: mmseg's,
mmdet's and mmpretrain's registries are its children and find an unscoped ``type`` there under any
of those default scopes, and in the upstream tools. A subclass of an mmseg or mmdet class, or a
part only one host uses (the classification tail and its checkpoint hook, for mmpretrain), belongs
to that package's own registry (``scope='mmseg'`` / ``'mmdet'`` / ``'mmpretrain'``). Every
registration in the package goes through the decorators below (one style) and never uses
``force=True``: a second module under a registered name raises and names both.
mmdet and mmpretrain are optional hosts: their parts are registered only where they are installed
(mmdet: :func:`host_imports`; mmpretrain is found rather than imported, in ``nala_mm/__init__.py``,
since its import loads its models and torchvision).
"""
import importlib
from typing import Optional, Type

from mmengine import registry as root_registries
from mmengine.registry import MODELS as ROOT_MODELS
from mmengine.registry import Registry


def host_imports(package: str) -> bool:
    """Whether the optional host ``package`` (``'mmdet'``) imports here. Imported, not only
    found: an installed package whose import fails (ImportError) is as absent, and has no
    registries to join. mmdet's own ``__init__`` is light (version checks)."""
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True


def registry_of(kind: str, scope: Optional[str] = None) -> Registry:
    """mmengine's root registry ``kind`` (``'MODELS'``, ``'HOOKS'``, ...; ``scope=None``) or the
    registry of that name in package ``scope``."""
    if scope is None:
        return getattr(root_registries, kind)
    return getattr(importlib.import_module(f'{scope}.registry'), kind)


def models_registry(scope: Optional[str] = None) -> Registry:
    """mmengine's root ``MODELS`` (``scope=None``) or the ``MODELS`` of package ``scope``."""
    return ROOT_MODELS if scope is None else registry_of('MODELS', scope)


def _registrar(kind: str, cls: Optional[Type], scope: Optional[str], name: Optional[str]):

    def register(target: Type) -> Type:
        registry = registry_of(kind, scope)
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


def register_model(cls: Optional[Type] = None, *, scope: Optional[str] = None,
                   name: Optional[str] = None):
    """Class decorator: register ``cls`` in :func:`models_registry` under ``name`` (default:
    the class's own name).

    ``@register_model``, ``@register_model(scope='mmseg')``, or with ``name=`` where one module
    defines a subclass of mmseg's and of mmdet's class that configs call by the same name.
    """
    return _registrar('MODELS', cls, scope, name)


def register_hook(cls: Optional[Type] = None, *, scope: Optional[str] = None,
                  name: Optional[str] = None):
    """Class decorator: as :func:`register_model`, into a ``HOOKS`` registry."""
    return _registrar('HOOKS', cls, scope, name)


def register_optim_wrapper(cls: Optional[Type] = None, *, scope: Optional[str] = None,
                           name: Optional[str] = None):
    """Class decorator: as :func:`register_model`, into an ``OPTIM_WRAPPERS`` registry."""
    return _registrar('OPTIM_WRAPPERS', cls, scope, name)


def register_optim_wrapper_constructor(cls: Optional[Type] = None, *,
                                       scope: Optional[str] = None, name: Optional[str] = None):
    """Class decorator: as :func:`register_model`, into an ``OPTIM_WRAPPER_CONSTRUCTORS``
    registry."""
    return _registrar('OPTIM_WRAPPER_CONSTRUCTORS', cls, scope, name)
