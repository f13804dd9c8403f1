"""Whole-image inference of an mmseg ``EncoderDecoder`` with one image's rows across ranks.

The backbone, where the memory of a huge image goes (its attention and activations at strides
4 to 32), runs token-parallel (:class:`.TokenParallel`). The neck and decode head take the light
route: the features are gathered and rank 0 runs them on the whole maps, as one process would;
so rank 0 holds the whole features and the head's activations, and the prediction is its alone.
"""
from typing import List, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .collectives import world_of
from .token_parallel import TokenParallel


class ShardedSegmentor(nn.Module):
    """``segmentor`` (an mmseg ``EncoderDecoder`` with a backbone :class:`.TokenParallel` takes)
    predicting images that every rank of ``process_group`` holds, one image shared by all."""

    def __init__(self, segmentor: nn.Module, process_group: Optional[dist.ProcessGroup] = None):
        super().__init__()
        self.segmentor = segmentor
        self.backbone = TokenParallel(segmentor.backbone, process_group)
        self.process_group = process_group

    @torch.no_grad()
    def predict(self, inputs: Tensor, data_samples: List) -> Optional[List]:
        """``EncoderDecoder.predict`` in its ``'whole'`` test mode on preprocessed ``inputs``
        (the same batch on every rank): the data samples with the predictions on rank 0,
        ``None`` on the others."""
        features = self.backbone.gather(self.backbone(inputs))
        if dist.get_rank(world_of(self.process_group)) != 0:
            return None
        segmentor = self.segmentor
        if segmentor.with_neck:
            features = segmentor.neck(features)
        seg_logits = segmentor.decode_head.predict(
            features, [sample.metainfo for sample in data_samples], segmentor.test_cfg)
        return segmentor.postprocess_result(seg_logits, data_samples)
