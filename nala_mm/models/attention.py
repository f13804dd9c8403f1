"""NaLa and softmax token mixers with the authors' parameter names (qkvg, lepe, ln, out_proj).

Both take and return channels-first maps ``(B, C, H, W)``. The attention math itself lives in
:mod:`nala_mm.ops`; these modules only project, mix, and gate.
"""
from functools import lru_cache
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from einops import rearrange
from mmengine.model import BaseModule
from torch import Tensor, nn

from ..ops import NaLaConfig, apply_rope, nala_attention, nala_attention_reference, rope_phasor, \
    rope_table
from ..registry import register_model

IMPLEMENTATIONS = ('fast', 'reference')


@lru_cache(maxsize=32)
def _cached_rope(height: int, width: int, head_dim: int, base: float,
                 device: torch.device) -> Tuple[Tensor, Tensor]:
    return rope_table(height, width, head_dim, base, device=device)


class _GatedAttention(BaseModule):
    """qkvg projection, token mixing (subclass), LePE on v, LayerNorm, SiLU gate, out_proj."""

    def __init__(self, embed_dims: int, num_heads: int, use_rope: bool = True,
                 rope_base: float = 10000.0, lepe_kernel_size: int = 5,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if embed_dims <= 0 or num_heads <= 0 or embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims must be a positive multiple of num_heads, got '
                             f'embed_dims={embed_dims}, num_heads={num_heads}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        if use_rope and self.head_dims % 4 != 0:
            raise ValueError(f'2D RoPE needs a head dim divisible by 4, got head_dim='
                             f'{self.head_dims} (embed_dims={embed_dims}, num_heads={num_heads})')
        self.use_rope = use_rope
        self.rope_base = rope_base
        self.qkvg = nn.Linear(embed_dims, 4 * embed_dims)
        self.lepe = nn.Conv2d(embed_dims, embed_dims, lepe_kernel_size,
                              padding=lepe_kernel_size // 2, groups=embed_dims)
        self.ln = nn.LayerNorm(embed_dims, eps=1e-5)
        self.out_proj = nn.Linear(embed_dims, embed_dims)

    def _mix(self, q: Tensor, k: Tensor, v: Tensor,
             rope: Optional[Tuple[Tensor, Tensor]]) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.embed_dims:
            raise ValueError(f'expected input (B, {self.embed_dims}, H, W), got {tuple(x.shape)}')
        height, width = x.shape[-2:]
        q, k, v, gate = self.qkvg(rearrange(x, 'b c h w -> b h w c')).chunk(4, dim=-1)
        rope = _cached_rope(height, width, self.head_dims, self.rope_base, x.device) \
            if self.use_rope else None
        to_heads = 'b h w (n d) -> b n (h w) d'
        # The mixing runs in float32 even under autocast: k^3 and the power overflow fp16/bf16.
        with torch.autocast(device_type=x.device.type, enabled=False):
            mixed = self._mix(*(rearrange(t.float(), to_heads, n=self.num_heads) for t in (q, k, v)),
                              rope)
        mixed = rearrange(mixed, 'b n (h w) d -> b h w (n d)', h=height).to(v.dtype)
        lepe = rearrange(self.lepe(rearrange(v, 'b h w c -> b c h w')), 'b c h w -> b h w c')
        out = self.out_proj(self.ln(mixed + lepe) * F.silu(gate))
        return rearrange(out, 'b h w c -> b c h w')


@register_model
class NormAwareLinearAttention(_GatedAttention):
    """NaLa: norm-aware linear attention (spec §1), linear in the number of tokens.

    Args:
        embed_dims: channels C.
        num_heads: heads; ``C / num_heads`` must be divisible by 4 when ``use_rope``.
        kernel: ``'cosine'`` (paper, cosine inhibit) or ``'relu'`` (released code, hard split).
        alpha, lam, tau, eps: see :class:`nala_mm.ops.NaLaConfig`.
        implementation: ``'fast'`` (default, hand-written backward) or ``'reference'``.
    """

    def __init__(self, embed_dims: int, num_heads: int, kernel: str = 'cosine',
                 alpha: float = 20.0, lam: float = 3.0, tau: float = 0.5, eps: float = 1e-6,
                 implementation: str = 'fast', **kwargs):
        super().__init__(embed_dims, num_heads, **kwargs)
        self.cfg = NaLaConfig(kernel=kernel, alpha=alpha, lam=lam, tau=tau, eps=eps)
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f'unknown implementation {implementation!r}; expected one of '
                             f'{IMPLEMENTATIONS}')
        self.implementation = implementation

    def _mix(self, q, k, v, rope):
        fn = nala_attention if self.implementation == 'fast' else nala_attention_reference
        return fn(q, k, v, self.cfg, rope)

    def extra_repr(self) -> str:
        return f'heads={self.num_heads}, {self.cfg}, implementation={self.implementation}'


@register_model
class SoftmaxAttention(_GatedAttention):
    """Full softmax attention on RoPE'd q, k (the released 'v' stages), through SDPA.

    ``scaled_dot_product_attention`` picks a memory-efficient / flash kernel where the device
    has one, so the N x N matrix is not stored on GPU.
    """

    def _mix(self, q, k, v, rope):
        if rope is not None:
            phasor = rope_phasor(*rope)
            q, k = apply_rope(q, phasor), apply_rope(k, phasor)
        return F.scaled_dot_product_attention(q, k, v)
