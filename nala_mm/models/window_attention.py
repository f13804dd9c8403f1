"""ViTDet's attention as a token mixer: softmax over non-overlapping windows, or over all tokens.

ViTDet (Li et al., ECCV 2022) keeps a plain ViT's attention, ``qkv`` and ``proj`` as a stock
ViT's, and restricts it to ``window_size x window_size`` windows in most blocks, global in a few.
Unlike :class:`~nala_mm.models.GatedAttention` this mixer has no gate, LePE or LayerNorm: it is
the stock function, so that a layout of such blocks *is* ViTDet's, and a stock ViT checkpoint's
q/k/v and projection load into it as they are (:func:`nala_mm.models.swap.carry_over`).

Padding is ViTDet's: the token grid is padded with zeros at the bottom and right to a multiple
of the window *before* the q/k/v projection, and the padded tokens are not masked (their keys and
values are the projection's biases), as detectron2's ``window_partition`` does; the padded rows
are cropped after the attention. Decomposed relative-position biases are not provided
(docs/user_guides/vitdet.md says what that changes).
"""
from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from mmengine.model import BaseModule
from torch import Tensor, nn

from ..ops import resolve_mode
from ..registry import register_model
from .mixers import token_sequence


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, mode: str = 'fast') -> Tensor:
    """``softmax(q k^T / sqrt(d)) v`` over ``(..., L, d)``: fused SDPA (``'fast'``) or the
    explicit weights (``'reference'``)."""
    if resolve_mode(mode, traceable=True) == 'fast':
        return F.scaled_dot_product_attention(q, k, v)
    weights = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
    return weights @ v


@register_model
class WindowSoftmaxAttention(BaseModule):
    """Multi-head softmax attention with a stock ViT's ``qkv`` and ``proj``, within windows.

    Args:
        embed_dims: channels C.
        num_heads: heads.
        window_size: side of the square windows (ViTDet: 14); ``0`` attends over all tokens
            (ViTDet's global blocks, through SDPA rather than explicit N x N weights).
        qkv_bias: whether ``qkv`` has a bias (a stock ViT's has).
        mode: ``'fast'`` (SDPA) or ``'reference'`` (explicit softmax), :mod:`nala_mm.ops.mode`.
    """

    def __init__(self, embed_dims: int, num_heads: int, window_size: int = 14,
                 qkv_bias: bool = True, mode: str = 'fast', init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        resolve_mode(mode)  # validates
        if embed_dims <= 0 or num_heads <= 0 or embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims must be a positive multiple of num_heads, got '
                             f'embed_dims={embed_dims}, num_heads={num_heads}')
        if not isinstance(window_size, int) or window_size < 0:
            raise ValueError(f'window_size must be a non-negative int (0: global), got '
                             f'{window_size!r}')
        self.embed_dims, self.num_heads, self.window_size = embed_dims, num_heads, window_size
        self.mode = mode
        self.qkv = nn.Linear(embed_dims, 3 * embed_dims, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)

    @classmethod
    def contract_variants(cls) -> Dict[str, dict]:
        """The settings the contract suite (``tests/contracts``) runs, as
        :meth:`GatedAttention.contract_variants <nala_mm.models.GatedAttention.contract_variants>`
        declares them: windows smaller than a test's grid (several windows, the last ones
        padded) and global attention (``window_size=0``, ViTDet's ``'sdpa'`` blocks)."""
        return {'window': dict(window_size=4), 'sdpa': dict(window_size=0)}

    def _attend(self, tokens: Tensor) -> Tensor:
        """``(B', L, C)`` -> attention among each row's ``L`` tokens, before ``proj``."""
        q, k, v = rearrange(self.qkv(tokens), 'b l (t n d) -> t b n l d', t=3, n=self.num_heads)
        return rearrange(softmax_attention(q, k, v, self.mode), 'b n l d -> b l (n d)')

    def _windowed(self, grid: Tensor) -> Tensor:
        """``(B, H, W, C)`` -> attention within each window, same shape (before ``proj``)."""
        batch, height, width, _ = grid.shape
        side = self.window_size
        pad_h, pad_w = -height % side, -width % side
        padded = F.pad(grid, (0, 0, 0, pad_w, 0, pad_h))  # zeros, bottom and right
        rows, cols = (height + pad_h) // side, (width + pad_w) // side
        windows = rearrange(padded, 'b (r h) (c w) x -> (b r c) (h w) x', h=side, w=side)
        mixed = rearrange(self._attend(windows), '(b r c) (h w) x -> b (r h) (c w) x',
                          b=batch, r=rows, c=cols, h=side)
        return mixed[:, :height, :width]

    def forward(self, x: Tensor, hw_shape: Optional[Sequence[int]] = None,
                num_prefix: int = 0) -> Tensor:
        """Channels-last tokens ``(B, H, W, C)``, or ``(B, num_prefix + H*W, C)`` with its grid
        ``hw_shape`` -> the same shape. Windows need a grid without prefix tokens (ViTDet's ViT
        has no class token); global attention takes them as any other token."""
        tokens, grid = token_sequence(x, self.embed_dims, hw_shape, num_prefix)
        if self.window_size == 0:
            mixed = self._attend(tokens)
        else:
            if num_prefix:
                raise ValueError(f'window attention partitions the patch grid; got '
                                 f'num_prefix={num_prefix} tokens without a grid position '
                                 f'(build the ViT with with_cls_token=False)')
            mixed = self._windowed(tokens.unflatten(1, grid)).flatten(1, 2)
        out = self.proj(mixed)
        return out if x.dim() == 3 else out.view(x.shape)

    def extra_repr(self) -> str:
        reach = f'window={self.window_size}' if self.window_size else 'global'
        return f'heads={self.num_heads}, {reach}, mode={self.mode}'
