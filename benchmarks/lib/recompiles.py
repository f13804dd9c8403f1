"""Graphs that compiled inference makes over the image sizes users meet.

:func:`count_compilations` runs a full-size model (random weights) through
:func:`nala_mm.apis.compile.compile_feature_extraction` over one of :data:`SIZE_SEQUENCES` and
counts the graphs after each size, with dynamo's ``backend='eager'`` (graph capture and its
guards, no code generation: the guards inductor gets). benchmarks/speed/compile.py reports the
counts; benchmarks/tests/test_recompiles.py bounds them (make test-extended).
"""
import os.path as osp
from typing import Dict, List

import torch

from nala_mm.apis.compile import compile_feature_extraction
from nala_mm.apis.config_loading import build_model_from_config
from nala_mm.apis.config_path import configs_root
from nala_mm.apis.data_samples import synthetic_batch

NALA_SEG = osp.join(configs_root(), 'ade20k_nala-t-linear_upernet.py')
# Sizes as the test pipelines hand them to the model: ADE20K's Resize to (2048, 512) with keep
# ratio (short side 512), slide windows of 512 over larger images, COCO's (1333, 800) keep-ratio
# resize (mmdet's preprocessor pads to 32), the ViT at sizes other than its 512² embedding.
SIZE_SEQUENCES: Dict[str, dict] = {
    'mmseg whole image': dict(config=NALA_SEG, cfg_options={},
                              sizes=[(512, 683), (512, 512), (512, 768), (683, 512), (512, 1024)]),
    'mmseg slide windows': dict(
        config=NALA_SEG, sizes=[(512, 683), (512, 910), (640, 1280)],
        cfg_options={'model.test_cfg': dict(mode='slide', crop_size=(512, 512),
                                            stride=(341, 341))}),
    'mmdet 1333x800, padded to 32': dict(
        config=osp.join(configs_root(), 'coco_nala-t-linear_mask-rcnn_1x.py'), cfg_options={},
        sizes=[(800, 1067), (1067, 800), (750, 1333), (800, 800), (800, 1201), (600, 1333)]),
    'ViT-S, interpolated position embedding': dict(
        config=osp.join(configs_root(), 'swap', 'ade20k_deit-s_upernet_nala-all.py'),
        cfg_options={},
        sizes=[(512, 683), (512, 512), (683, 512), (512, 1024), (640, 853), (768, 1024),
               (683, 910)]),
}


def count_compilations(name: str) -> List[int]:
    """Graphs compiled after each size of ``SIZE_SEQUENCES[name]`` (dynamo with the eager
    backend: the same guards inductor gets)."""
    sequence = SIZE_SEQUENCES[name]
    torch._dynamo.reset()
    options = dict(sequence['cfg_options'], **{'model.backbone.init_cfg': None})
    model, scope = build_model_from_config(sequence['config'], options)
    compiled = compile_feature_extraction(model, backend='eager')
    counts = []
    for height, width in sequence['sizes']:
        with torch.no_grad():
            model.test_step(synthetic_batch(scope, 1, height, width))
        counts.append(compiled.compilations)
    return counts
