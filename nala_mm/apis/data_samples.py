"""Synthetic batches in the form mmseg's and mmdet's models take: random images with the
metadata a test pipeline gives, for measuring and tracing a model without a dataset."""
from typing import List, Optional

import torch


def data_samples(scope: str, batch: int, height: int, width: int,
                 num_classes: Optional[int] = None, device='cpu') -> list:
    """``batch`` ``SegDataSample`` (``scope='mmseg'``) or ``DetDataSample`` (``'mmdet'``) of one
    ``height`` x ``width`` image each; with ``num_classes`` (segmentation), random ground truth."""
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample as Sample
    elif scope == 'mmseg':
        from mmseg.structures import SegDataSample as Sample
    else:
        raise ValueError(f"scope must be 'mmseg' or 'mmdet', got {scope!r}")
    if num_classes is not None and scope != 'mmseg':
        raise ValueError('random ground truth is drawn for segmentation only')
    shape = (height, width)
    meta = dict(img_shape=shape, ori_shape=shape, pad_shape=shape, batch_input_shape=shape,
                scale_factor=(1.0, 1.0), flip=False, flip_direction=None)
    samples = []
    for _ in range(batch):
        sample = Sample(metainfo=dict(meta))
        if num_classes is not None:
            from mmengine.structures import PixelData
            sample.gt_sem_seg = PixelData(
                data=torch.randint(0, num_classes, (1, *shape), device=device))
        samples.append(sample)
    return samples


def synthetic_batch(scope: str, batch: int, height: int, width: int,
                    num_classes: Optional[int] = None, seed: int = 0) -> dict:
    """``dict(inputs, data_samples)`` as a dataloader gives it: ``batch`` random uint8 images
    (drawn from ``seed``) and their :func:`data_samples`, for ``model.test_step`` or
    ``train_step``."""
    generator = torch.Generator().manual_seed(seed)
    images: List[torch.Tensor] = [
        torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)
        for _ in range(batch)]
    return dict(inputs=images,
                data_samples=data_samples(scope, batch, height, width, num_classes))
