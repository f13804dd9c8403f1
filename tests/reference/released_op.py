"""NaLa in the released code's op sequence (``kernel='relu'``): the one transcription that the
benchmarks time the fast path against and the parity tests hold it to.

It keeps the released structure on purpose (separate ReLU copies, a per-token power, a concat
per feature, k and v scaled by N^-1/2, RoPE applied to each feature half on its own). It imports
nothing from the rest of ``nala_mm`` (its own pair rotation and zero-norm guard), so a check
against it does not check the package against itself. Unlike the released code it maps a zero
query to zero features instead of 0/0.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

# The smallest query norm divided by: a zero query keeps zero features instead of 0/0.
ZERO_NORM_GUARD = 1e-12


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Turn channel pair (2i, 2i+1) of ``x (..., N, d)`` by the angle whose ``cos``/``sin``
    are entry i of the ``(N, d/2)`` tables."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def nala_attention_released(q: Tensor, k: Tensor, v: Tensor, lam: float = 3.0, tau: float = 0.5,
                            eps: float = 1e-6,
                            rope: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
    """``(B, heads, N, d)`` q, k, v; ``rope`` a ``(cos, sin)`` pair of ``(N, d/2)`` tables, one
    angle per channel pair."""
    n_tokens = k.shape[-2]
    q_norm = q.norm(dim=-1, keepdim=True)
    q_dir = q / q_norm.clamp_min(ZERO_NORM_GUARD)
    power = lam * (tau + torch.tanh(q_norm))
    q_pos = F.relu(q_dir) ** power
    q_neg = F.relu(-q_dir) ** power
    k = k ** 3
    k_pos = F.relu(k)
    k_neg = F.relu(-k)
    q_feat = torch.cat([q_pos, q_neg], dim=-1)
    k_feat = torch.cat([k_pos, k_neg], dim=-1)
    scale = n_tokens ** -0.5
    k_feat = k_feat * scale
    v = v * scale
    z = 1 / (q_feat @ k_feat.mean(dim=-2, keepdim=True).transpose(-2, -1) / scale + eps)
    if rope is not None:
        q_rot = torch.cat([rotate_pairs(q_pos, *rope), rotate_pairs(q_neg, *rope)], dim=-1)
        k_rot = torch.cat([rotate_pairs(k_pos * scale, *rope),
                           rotate_pairs(k_neg * scale, *rope)], dim=-1)
    else:
        q_rot, k_rot = q_feat, k_feat
    kv = k_rot.transpose(-2, -1) @ v
    return q_rot @ kv * z
