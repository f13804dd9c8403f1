"""nala-mm: NaLaFormer (norm-aware linear attention) for MMSegmentation 1.x and MMDetection 3.x.

``custom_imports = dict(imports=['nala_mm'])`` in any mm config registers the backbone, the
attention layers and the datasets, and makes checkpoints of the Runner load under torch's
weights-only unpickling (see :mod:`nala_mm.checkpoint_safety`).
"""
from .checkpoint_safety import install_checkpoint_safety
from .version import __version__

install_checkpoint_safety()

from . import datasets, hooks, models, runtime  # noqa: E402,F401  (registration side effects)
from .models import (GatedAttention, LinearAttention, NaLaFormer,  # noqa: E402
                     NormAwareLinearAttention, SoftmaxAttention)

__all__ = ['__version__', 'NaLaFormer', 'GatedAttention', 'NormAwareLinearAttention',
           'LinearAttention', 'SoftmaxAttention']
