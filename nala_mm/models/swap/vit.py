"""The ViT family: NaLa inside mmseg's ``VisionTransformer`` (UperNet-ViT, Segmenter, SETR, DPT),
one mixer per layer.

A plain ViT attends globally through mmcv's ``MultiheadAttention``, which materialises the N x N
weights: this is where a linear-cost mixer changes the cost class. What is ViT-specific:

* **The grid.** ``VisionTransformer.forward`` calls ``layer(x)`` without the patch grid, which
  LePE and 2D RoPE need. A forward hook on ``patch_embed`` (whose output carries the grid)
  records it for the swapped layers of the same forward; the parent's ``forward`` is unchanged.
* **The class token** (``with_cls_token=True``): it has no grid position. It leads the token
  sequence as a prefix token of the mixer (:meth:`GatedAttention.forward`): it attends to every
  patch and every patch attends to it, it is left unrotated by RoPE and outside LePE.
* **Freezing.** The parent applies ``frozen_exclude`` in ``__init__``, before the swap adds the
  mixers' parameters; it is applied again after the swap.
* **The checkpoint.** mmseg's layout (``vit2mmseg`` of timm/DeiT files), q | k | v in
  ``layers.{i}.attn.attn.in_proj_weight``; the positional embedding is resized to the model's
  grid as the parent does.

* **Detection.** ViTDet's backbone is this class with ``with_cls_token=False`` and
  ``out_indices=(num_layers - 1,)``: the last layer's stride-16 map, which ``SimpleFPN`` takes;
  its window blocks are ``'window'`` mixers (:mod:`nala_mm.models.window_attention`).

Registered: ``NaLaVisionTransformer`` in mmseg's registry, and the same class in mmdet's where
mmdet is installed (:mod:`.detection`).
"""
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch
from mmseg.models.backbones import VisionTransformer
from torch import Tensor, nn

from ...ops.token_shard import active_shard
from ...registry import register_model
from ..mixer_specs import MixerEntry, build_mixer
from .base import SwappedAttention, SwappedAttentionMixin
from .spatial_reduction import SPATIAL_REDUCTION_ATTENTION

# mmcv's MultiheadAttention (``layers.{i}.attn``) around torch's nn.MultiheadAttention (``attn``):
# the same tensors as in MiT and PVTv2
VIT_ATTENTION = SPATIAL_REDUCTION_ATTENTION


class PatchGrid:
    """The patch grid ``(H, W)`` of the forward in progress, shared by a ViT's swapped layers."""

    def __init__(self):
        self.hw_shape: Optional[Tuple[int, int]] = None

    def record(self, module: nn.Module, args: tuple, output: Tuple[Tensor, Sequence[int]]):
        """Forward hook of ``patch_embed``, which returns ``(tokens, hw_shape)``."""
        self.hw_shape = tuple(output[1])


class GlobalTokenAttention(SwappedAttention):
    """mmcv ``MultiheadAttention``'s slot in a ViT layer, ``forward(query, identity=None) ->
    identity + dropout_layer(proj_drop(mixed))`` (the residual is added here, as upstream): the
    mixer attends over the class token (when there is one) and the patch grid."""

    def __init__(self, mixer: nn.Module, grid: PatchGrid, num_prefix: int,
                 proj_drop: nn.Module, drop_path: nn.Module):
        super().__init__(mixer, proj_drop, drop_path)
        self.grid = grid
        self.num_prefix = num_prefix

    def forward(self, query: Tensor, identity: Optional[Tensor] = None, **kwargs) -> Tensor:
        if kwargs.get('key') is not None or kwargs.get('value') is not None:
            raise ValueError('a swapped ViT layer attends over its own tokens (self-attention); '
                             'got a separate key/value')
        if self.grid.hw_shape is None:
            raise RuntimeError('the patch grid is unknown: a swapped ViT layer runs inside its '
                               "backbone's forward, after patch_embed")
        return (query if identity is None else identity) + \
            self.branch(query, self.grid.hw_shape, self.num_prefix)


class ViTLayers(SwappedAttentionMixin):
    """mmseg's ViT: one ``mixers`` entry per layer (``layers[i]``, attention in ``.attn``)."""
    attention_layout = VIT_ATTENTION
    mixer_unit = 'layer'

    def __init__(self, mixers: Sequence[MixerEntry], **kwargs):
        self._grid = PatchGrid()
        super().__init__(mixers=mixers, **kwargs)
        self.patch_embed.register_forward_hook(self._grid.record)

    def _num_units(self):
        return len(self.layers)

    def _unit_blocks(self, unit):
        return [self.layers[unit]]

    def _global_attention(self, stock, mixer_cfg):
        mixer = build_mixer(mixer_cfg, stock.embed_dims, stock.num_heads, self.mode)
        return GlobalTokenAttention(mixer, self._grid, int(self.with_cls_token),
                                    proj_drop=stock.proj_drop, drop_path=stock.dropout_layer)

    def _after_swap(self):
        self._freeze()  # the parent froze before the mixers existed

    def train(self, mode: bool = True) -> 'ViTLayers':
        """As the parent (``norm_eval`` applied), returning the module as every ``nn.Module``
        does (mmseg's ``VisionTransformer.train`` returns ``None``)."""
        super().train(mode)
        return self

    def _pos_embeding(self, patched_img: Tensor, hw_shape: Sequence[int],
                      pos_embed: Tensor) -> Tensor:
        """As the parent, except on a stripe of an image split across ranks
        (:mod:`nala_mm.parallel`): the table is resized to the whole image's grid and this
        stripe's rows taken (the parent would resize it to the stripe)."""
        shard = active_shard()
        if shard is None:
            return super()._pos_embeding(patched_img, hw_shape, pos_embed)
        first, rows = shard.grid_rows(self.patch_embed)
        height, width = hw_shape
        pos_h, pos_w = (side // self.patch_size for side in self.img_size)
        if (rows, width) != (pos_h, pos_w):
            pos_embed = self.resize_pos_embed(pos_embed, (rows, width), (pos_h, pos_w),
                                              self.interpolate_mode)
        grid = pos_embed[:, 1:].unflatten(1, (rows, width))[:, first:first + height]
        pos_embed = torch.cat([pos_embed[:, :1], grid.flatten(1, 2)], dim=1)
        return self.drop_after_pos(patched_img + pos_embed)

    def before_blocks(self, inputs: Tensor) -> None:
        """The patch grid of ``inputs`` for layers called on their own (patch_embed's hook)."""
        with torch.no_grad():
            self.patch_embed(inputs)

    def adapt_state(self, state: Dict[str, Tensor],
                     model_state: Mapping[str, Tensor]) -> Dict[str, Tensor]:
        """The positional embedding resized to the model's grid, as the parent's
        ``init_weights`` does (the class token's entry kept)."""
        stored = state.get('pos_embed')
        if stored is not None and stored.shape != model_state['pos_embed'].shape:
            side = int((stored.shape[1] - 1) ** 0.5)
            height, width = self.img_size
            state['pos_embed'] = self.resize_pos_embed(
                stored, (height // self.patch_size, width // self.patch_size), (side, side),
                self.interpolate_mode)
        return state


@register_model(scope='mmseg')
class NaLaVisionTransformer(ViTLayers, VisionTransformer):
    """mmseg's ``VisionTransformer`` with a token mixer per layer.

    Args:
        mixers: one entry per layer (``num_layers`` of them, no default): ``'softmax'`` keeps
            the layer's stock ``MultiheadAttention``; ``'nala'``, ``'linear'`` or a registered
            mixer's config put that mixer, attending over the class token and the whole patch
            grid with LePE and 2D RoPE on the grid, in its place; ``'window'`` and ``'sdpa'``
            are ViTDet's stock softmax in 14 x 14 windows and globally through SDPA.
        mode: ``'fast'`` or ``'reference'`` for every swapped layer's mixer
            (:mod:`nala_mm.ops.mode`).
        pretrained_mismatch: what a tensor of the ``Pretrained`` checkpoint whose shape differs
            from the model's (after the positional embedding's resize) does: ``'raise'``
            (default) raises a ``ValueError`` naming it and both shapes (the stock parent only
            warns); ``'skip'`` keeps it as initialised and logs it, for a deliberate partial
            load (e.g. ``in_channels=4`` from an RGB file).
        **kwargs: every argument of mmseg's ``VisionTransformer``. A ``Pretrained`` ``init_cfg``
            (or ``pretrained``) of a stock ViT checkpoint carries each swapped layer's q/k/v and
            output projection into its mixer (:mod:`.base`).
    """
