"""ViTDet's simple feature pyramid: five maps from a plain ViT's one stride-16 map.

mmdet 3.3.0 from pip has no ``SimpleFPN`` (it lives in the repository's ``projects/ViTDet``);
this is the pyramid of Li et al. (ECCV 2022) written for mmdet's registry. From the stride-16
map: stride 4 by two 2x2 transposed convolutions (LayerNorm2d and GELU between them), stride 8
by one, stride 16 as it is, stride 32 by a 2x2 max-pool; each then goes through a 1x1 and a
3x3 convolution, each followed by LayerNorm2d, to ``out_channels``. Stride 64, which the RPN's
anchors need, is a stride-2 subsampling of stride 32 (ViTDet's ``LastLevelMaxPool``).

``scale_factors`` adapts it to a backbone of another stride, as detectron2's
``SimpleFeaturePyramid`` does: a factor 2^k > 1 is k transposed convolutions, 1 the map as it
is, 2^-k a 2^k x 2^k max-pool; the default (4, 2, 1, 0.5) is ViTDet's for patch 16, and
(2, 1, 0.5, 0.25) gives strides 4-32 from a patch-8 ViT.

Registered: ``LN2d`` (:class:`LayerNorm2d`, a norm ``norm_cfg`` can name, as ViTDet's heads do)
and ``SimpleFPN``, in mmdet's registry; :mod:`nala_mm.models` imports this module only where
mmdet imports.
"""
from typing import List, Optional, Sequence, Tuple

import torch.nn.functional as F
from mmcv.cnn import ConvModule, build_norm_layer
from mmengine.model import BaseModule
from torch import Tensor, nn

from ..registry import register_model


@register_model(scope='mmdet', name='LN2d')
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a ``(B, C, H, W)`` map, at every position."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@register_model(scope='mmdet')
class SimpleFPN(BaseModule):
    """ViTDet's pyramid from a single stride-16 map.

    Args:
        in_channels: channels of the backbone's map (ViT-B: 768); divisible by 4.
        out_channels: channels of every output map (ViTDet: 256).
        num_outs: 4 (strides 4-32) or 5 (and 64, for the RPN); ViTDet uses 5.
        scale_factors: each output's size over the input map's, finest first: four powers of
            two from 4 to 1/4, halving from one to the next (the outputs' strides double).
        norm_cfg: norm after each convolution (and between the two transposed ones).
        init_cfg: mmengine initialisation config.

    Input: the backbone's outputs, a sequence whose last entry is the ``(B, in_channels,
    H, W)`` stride-16 map. Output: ``num_outs`` maps, strides 4, 8, 16, 32 (and 64), each
    ``(B, out_channels, ., .)``.
    """

    def __init__(self, in_channels: int, out_channels: int = 256, num_outs: int = 5,
                 scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
                 norm_cfg: Optional[dict] = None, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if in_channels <= 0 or in_channels % 4 != 0:
            raise ValueError(f'in_channels must be a positive multiple of 4 (the stride-4 '
                             f'branch quarters it), got {in_channels}')
        if num_outs not in (4, 5):
            raise ValueError(f'num_outs must be 4 (strides 4-32) or 5 (and 64), got {num_outs}')
        factors = tuple(float(f) for f in scale_factors)
        allowed = [(4.0, 2.0, 1.0, 0.5), (2.0, 1.0, 0.5, 0.25)]
        if factors not in allowed:
            raise ValueError(f'scale_factors must be one of {allowed} (finest first, halving), '
                             f'got {tuple(scale_factors)}')
        norm_cfg = norm_cfg or dict(type='LN2d')
        self.in_channels, self.out_channels, self.num_outs = in_channels, out_channels, num_outs
        self.scale_factors = factors
        half, quarter = in_channels // 2, in_channels // 4
        branches = {
            4.0: nn.Sequential(nn.ConvTranspose2d(in_channels, half, 2, stride=2),
                               build_norm_layer(norm_cfg, half)[1], nn.GELU(),
                               nn.ConvTranspose2d(half, quarter, 2, stride=2)),
            2.0: nn.ConvTranspose2d(in_channels, half, 2, stride=2),
            1.0: nn.Identity(), 0.5: nn.MaxPool2d(2, stride=2), 0.25: nn.MaxPool2d(4, stride=4)}
        self.resample = nn.ModuleList(branches[f] for f in factors)
        widths = [{4.0: quarter, 2.0: half}.get(f, in_channels) for f in factors]
        self.lateral = nn.ModuleList(
            ConvModule(width, out_channels, 1, bias=False, norm_cfg=norm_cfg, act_cfg=None)
            for width in widths)
        self.output = nn.ModuleList(
            ConvModule(out_channels, out_channels, 3, padding=1, bias=False, norm_cfg=norm_cfg,
                       act_cfg=None) for _ in widths)

    def forward(self, inputs: Sequence[Tensor]) -> Tuple[Tensor, ...]:
        if isinstance(inputs, Tensor) or not len(inputs):
            raise TypeError('SimpleFPN takes the backbone\'s outputs, a sequence ending with the '
                            f'stride-16 map; got {type(inputs).__name__}')
        x = inputs[-1]
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'expected a (B, {self.in_channels}, H, W) map, got '
                             f'{tuple(x.shape)}')
        outs: List[Tensor] = [output(lateral(resample(x))) for resample, lateral, output
                              in zip(self.resample, self.lateral, self.output)]
        if self.num_outs == 5:
            outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        return tuple(outs)
