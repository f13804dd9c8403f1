"""nala-mm: NaLaFormer (norm-aware linear attention) for MMSegmentation 1.x and MMDetection 3.x.

``custom_imports = dict(imports=['nala_mm'])`` in any mm config registers the backbone, the token
mixers, ``RNGStateHook``, ``BF16AutocastOptimWrapper`` and ``ViTLayerDecayOptimWrapperConstructor``
in mmengine's root registries (:mod:`nala_mm.engine`), and the stock backbones with NaLa swapped
in (:mod:`nala_mm.models.swap`) in mmseg's own; where mmdet imports (``pip install
nala-mm[det]``), also mmdet's swapped backbones and ViTDet's ``SimpleFPN`` in mmdet's (without
it, nothing of mmdet is imported); where mmpretrain is installed, also the classification tail
and its checkpoint hook in mmpretrain's (:mod:`nala_mm.models.classifier`,
:mod:`nala_mm.engine.hooks`). It changes nothing else and loads nothing it does not register:
:mod:`nala_mm.apis` (what the tools call) and :mod:`nala_mm.analysis` load on use. The host
changes the project's tools rely on (checkpoints under weights-only loading, atomic writes, CPU
``torchrun``, data checks) are opt-in: the tools install them, a config names
``'nala_mm.compat.enable'`` too (see :mod:`nala_mm.compat`).
"""
import importlib
import importlib.util
import warnings

from . import engine, models  # noqa: F401  (registration)
from .models import (
                     GatedAttention,
                     LinearAttention,
                     NaLaFormer,
                     NormAwareLinearAttention,
                     SoftmaxAttention,
)
from .version import __version__

if importlib.util.find_spec('mmpretrain') is not None:
    from .models import classifier  # noqa: F401  (registration in mmpretrain's registries)

# Modules that moved into apis/ and engine/ in 0.1.0, by the names the README and docs showed:
# ``nala_mm.compile.compile_model`` still resolves (with a warning naming the new home).
# ``import nala_mm.compile`` / ``from nala_mm.compile import ...`` do not: use the new path.
MOVED = {
    'compile': 'nala_mm.apis.compile',
    'config_loading': 'nala_mm.apis.config_loading',
    'config_path': 'nala_mm.apis.config_path',
    'deploy': 'nala_mm.apis.export',
    'linearize': 'nala_mm.apis.linearize',
    'hooks': 'nala_mm.engine.hooks',
}


def __getattr__(name: str):
    if name in MOVED:
        warnings.warn(f'nala_mm.{name} moved to {MOVED[name]}', FutureWarning, stacklevel=2)
        return importlib.import_module(MOVED[name])
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')

__all__ = ['__version__', 'NaLaFormer', 'GatedAttention', 'NormAwareLinearAttention',
           'LinearAttention', 'SoftmaxAttention']
