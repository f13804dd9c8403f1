"""Runner hooks: :class:`RNGStateHook` (mmengine's root ``HOOKS``) and, where mmpretrain is
installed, :class:`AuthorsCheckpointHook` (mmpretrain's ``HOOKS``)."""
import importlib.util

from .rng_state_hook import RNGStateHook

__all__ = ['RNGStateHook']

if importlib.util.find_spec('mmpretrain') is not None:
    from .authors_checkpoint_hook import AuthorsCheckpointHook  # noqa: F401  (registration)
    __all__.append('AuthorsCheckpointHook')
