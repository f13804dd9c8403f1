"""Loaded at start-up by every Python process of a test run on a machine whose only torchvision
is a build for another variant of torch (tests/support/pretrain.py says when): its compiled ops
cannot load, and ``import torchvision`` then stops at the two fake-kernel registrations it makes
without checking that the ops exist. Defining those two op schemas (no kernels) lets its Python
part import, as a CPU build whose ops failed to load would. mmpretrain's classifiers call none of
torchvision's compiled ops."""
import torch

_TORCHVISION_OPS = torch.library.Library('torchvision', 'DEF')
for _name in ('nms', 'qnms'):
    _TORCHVISION_OPS.define(f'{_name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
