"""nala-mm: NaLaFormer (norm-aware linear attention) for MMSegmentation 1.x and MMDetection 3.x.

``custom_imports = dict(imports=['nala_mm'])`` in any mm config registers the backbone, the token
mixers, ``RNGStateHook``, ``MixerStatsHook`` and ``BF16AutocastOptimWrapper`` in mmengine's root
registries, and the stock backbones with NaLa swapped in (:mod:`nala_mm.models.swap`) in mmseg's
own; where mmdet imports (``pip install nala-mm[det]``), also mmdet's swapped backbones and
ViTDet's ``SimpleFPN`` in mmdet's (without it, nothing of mmdet is imported); where mmpretrain
is installed, also the classification tail and its checkpoint hook in mmpretrain's
(:mod:`nala_mm.models.classifier`). It changes nothing else. The host changes the project's
tools rely on (checkpoints under weights-only loading, atomic writes, CPU ``torchrun``, data
checks) are opt-in: the tools install them, a config names ``'nala_mm.compat.enable'`` too
(see :mod:`nala_mm.compat`).
"""
import importlib.util

from . import amp, hooks, models, optim  # noqa: F401  (registration)
from .analysis import training_stats  # noqa: F401  (registration)
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

__all__ = ['__version__', 'NaLaFormer', 'GatedAttention', 'NormAwareLinearAttention',
           'LinearAttention', 'SoftmaxAttention']
