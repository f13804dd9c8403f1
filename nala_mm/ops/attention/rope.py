"""2D rotary position embedding on per-head features (docs/user_guides/method.md, "2D RoPE").

A head of width ``d`` holds ``d/2`` channel pairs ``(2i, 2i+1)``: the first ``d/4`` pairs rotate
by ``row * f_i``, the last ``d/4`` by ``col * f_i``. The released model's frequencies are
``f_i = base^(-i / (d/4 - 1))``, i = 0..d/4-1 (its exponent is ``linspace(0, 1, d/4)``: the first
is 1, the last exactly ``1/base``), not the common ``base^(-i / (d/4))``; its checkpoints store
them, each repeated for its pair, as ``layers.{i}.RoPE.angle``. A feature of width ``D = n * d``
(NaLa's 2d-wide features) is rotated one d-wide chunk at a time with the same table.
"""
from functools import lru_cache
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..mode import resolve_mode

# A ``(cos, sin)`` table pair, each ``(N, d/2)``; ``None`` where a mixer uses no RoPE.
Rope = Optional[Tuple[Tensor, Tensor]]


def rope_frequencies(head_dim: int, base: float = 10000.0) -> Tensor:
    """The ``d/4`` released frequencies of one axis, ``base^(-i / (d/4 - 1))``.

    With ``d/4 = 1`` the single frequency is 1 (the released ``linspace(0, 1, 1)`` is ``[0]``).
    """
    if head_dim <= 0 or head_dim % 4 != 0:
        raise ValueError(f'2D RoPE needs a positive head dim divisible by 4, got '
                         f'head_dim={head_dim}')
    quarter = head_dim // 4
    exponents = torch.arange(quarter, dtype=torch.float64) / max(quarter - 1, 1)
    return (1.0 / base ** exponents).float()


def rope_angle_buffer(head_dim: int, base: float = 10000.0) -> Tensor:
    """The released checkpoints' ``RoPE.angle`` layout: each frequency repeated for its pair,
    ``(d/2,)``."""
    return rope_frequencies(head_dim, base).repeat_interleave(2)


def rope_angles(height: int, width: int, frequencies: Tensor, first_row: int = 0) -> Tensor:
    """Rotation angle of every (token, pair): ``(H*W, d/2)`` in row-major token order; the rows
    are ``first_row .. first_row + H - 1`` (a stripe of a taller grid, token parallelism)."""
    rows = torch.arange(first_row, first_row + height, dtype=torch.float32,
                        device=frequencies.device)
    cols = torch.arange(width, dtype=torch.float32, device=frequencies.device)
    row_angles = torch.outer(rows, frequencies)  # (H, d/4)
    col_angles = torch.outer(cols, frequencies)  # (W, d/4)
    angles = torch.cat([
        row_angles[:, None, :].expand(height, width, -1),
        col_angles[None, :, :].expand(height, width, -1),
    ], dim=-1)
    return angles.reshape(height * width, -1)


def rope_table(height: int, width: int, head_dim: int, base: float = 10000.0,
               device=None, first_row: int = 0) -> Tuple[Tensor, Tensor]:
    """``(cos, sin)`` tables, each ``(H*W, d/2)``, float32."""
    angles = rope_angles(height, width, rope_frequencies(head_dim, base).to(device), first_row)
    return angles.cos(), angles.sin()


def _with_prefix(table: Tuple[Tensor, Tensor], prefix: int) -> Tuple[Tensor, Tensor]:
    """``prefix`` identity rows (cos 1, sin 0) ahead of the table: tokens RoPE leaves alone."""
    if not prefix:
        return table
    cos, sin = table
    return (torch.cat([cos.new_ones(prefix, cos.shape[1]), cos]),
            torch.cat([sin.new_zeros(prefix, sin.shape[1]), sin]))


@lru_cache(maxsize=32)
def _cached_rope_table(height: int, width: int, head_dim: int, base: float,
                       device: torch.device, prefix: int,
                       first_row: int) -> Tuple[Tensor, Tensor]:
    return _with_prefix(rope_table(height, width, head_dim, base, device, first_row), prefix)


def rope_table_for(height: int, width: int, head_dim: int, base: float, device: torch.device,
                   mode: str = 'fast', prefix: int = 0,
                   first_row: int = 0) -> Tuple[Tensor, Tensor]:
    """:func:`rope_table` of one feature-map size, after ``prefix`` identity rows for tokens
    without a grid position (a ViT's class token). The fast mode caches it by size, the
    reference mode (and exporting, whose sizes are symbolic and cannot key a cache) builds it in
    the graph so that an exported model accepts any input size. ``first_row``: the grid is
    a stripe of a taller one, starting at that row (token parallelism)."""
    if resolve_mode(mode) == 'reference':
        return _with_prefix(rope_table(height, width, head_dim, base, device, first_row), prefix)
    return _cached_rope_table(height, width, head_dim, base, device, prefix, first_row)


def apply_rope_reference(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs of ``x`` (..., N, D), D a multiple of ``2 * cos.shape[-1]``; plain form."""
    half_pairs = cos.shape[-1]
    chunks = x.split(2 * half_pairs, dim=-1)
    rotated = []
    for chunk in chunks:
        even, odd = chunk[..., 0::2], chunk[..., 1::2]
        rot_even = even * cos - odd * sin
        rot_odd = even * sin + odd * cos
        rotated.append(torch.stack([rot_even, rot_odd], dim=-1).flatten(-2))
    return torch.cat(rotated, dim=-1)


def rope_phasor(cos: Tensor, sin: Tensor) -> Tensor:
    """The table as unit complex numbers ``(N, 1, d/2)`` for :func:`apply_rope`."""
    return torch.complex(cos, sin).unsqueeze(-2)


def apply_rope(x: Tensor, phasor: Tensor, inverse: bool = False) -> Tensor:
    """Fast rotation: one complex multiply over all d-wide chunks of ``x`` (float32).

    ``inverse=True`` applies the transposed (inverse) rotation, used in the backward pass.
    """
    pairs = phasor.shape[-1]
    shape = x.shape
    as_complex = torch.view_as_complex(x.reshape(*shape[:-1], -1, pairs, 2).contiguous())
    # conj_physical: a lazy conj() (a conjugate bit on a view) reads back unconjugated when the
    # op runs inside a compiled graph (AOTAutograd, torch 2.13)
    rotated = as_complex * (phasor.conj_physical() if inverse else phasor)
    return torch.view_as_real(rotated).reshape(shape)
