"""NaLa attention as the spec writes it (§1): the plain reference, differentiated by autograd.

Tensors are ``(B, heads, N, d)``. This module is the readable ground truth; the default path is
:mod:`nala_mm.ops.nala_fast`, and tests hold the two to 1e-5.
"""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .rope2d import apply_rope_reference

KERNELS = ('cosine', 'relu')
# A query of exactly zero norm has no direction; its features are defined as zero (the
# released code divides 0 by 0 there).
NORM_FLOOR = 1e-12


@dataclass(frozen=True)
class NaLaConfig:
    """Hyper-parameters of the norm-aware kernel.

    kernel: ``'cosine'`` (the paper's cosine inhibit) or ``'relu'`` (the released hard split).
    alpha:  sharpness of the cosine-inhibit angle ``(pi/4) tanh(alpha x/||x||)``.
    lam, tau: query power ``p(rho) = lam * (tau + tanh(rho))``.
    eps:    added to the normaliser.
    """
    kernel: str = 'cosine'
    alpha: float = 20.0
    lam: float = 3.0
    tau: float = 0.5
    eps: float = 1e-6

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f'unknown NaLa kernel {self.kernel!r}; expected one of {KERNELS}')
        for name in ('alpha', 'lam'):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f'NaLa {name} must be > 0, got {name}={value}')
        if self.tau < 0:
            raise ValueError(f'NaLa tau must be >= 0 (the power must stay positive), got tau={self.tau}')
        if not self.eps > 0:
            raise ValueError(f'NaLa eps must be > 0, got eps={self.eps}')


def query_power(rho: Tensor, cfg: NaLaConfig) -> Tensor:
    """Per-token exponent ``p = lam (tau + tanh rho)``: larger norm, spikier row."""
    return cfg.lam * (cfg.tau + torch.tanh(rho))


def inhibit_angle(x: Tensor, cfg: NaLaConfig) -> Tensor:
    """Cosine-inhibit angle ``(pi/4) tanh(alpha x / ||x||)`` per component."""
    direction = x / x.norm(dim=-1, keepdim=True).clamp_min(NORM_FLOOR)
    return (math.pi / 4) * torch.tanh(cfg.alpha * direction)


def split_features(signed: Tensor, magnitude: Tensor, source: Tensor, cfg: NaLaConfig) -> Tensor:
    """Map a signed feature to the non-negative 2d-wide one of the chosen kernel."""
    if cfg.kernel == 'relu':
        return torch.cat([F.relu(signed), F.relu(-signed)], dim=-1)
    theta = inhibit_angle(source, cfg)
    return torch.cat([magnitude * torch.cos(theta), magnitude * torch.sin(theta)], dim=-1)


def query_features(q: Tensor, cfg: NaLaConfig) -> Tensor:
    """phi(q): direction raised to the norm-dependent power, split to be non-negative."""
    rho = q.norm(dim=-1, keepdim=True)
    direction = q / rho.clamp_min(NORM_FLOOR)
    power = query_power(rho, cfg)
    if cfg.kernel == 'relu':
        return torch.cat([F.relu(direction) ** power, F.relu(-direction) ** power], dim=-1)
    return split_features(direction, direction.abs() ** power, q, cfg)


def key_features(k: Tensor, cfg: NaLaConfig) -> Tensor:
    """phi(k): cubed keys (sign kept), split to be non-negative."""
    cubed = k ** 3
    return split_features(cubed, cubed.abs(), k, cfg)


def _rotated_features(q: Tensor, k: Tensor, cfg: NaLaConfig,
                      rope: Optional[Tuple[Tensor, Tensor]]) -> Tuple[Tensor, Tensor, Tensor]:
    """(phi_q, phi_k) rotated for the numerator, and the normaliser z from unrotated ones."""
    phi_q, phi_k = query_features(q, cfg), key_features(k, cfg)
    normaliser = 1.0 / (phi_q @ phi_k.mean(dim=-2, keepdim=True).transpose(-1, -2) + cfg.eps)
    if rope is not None:
        phi_q, phi_k = apply_rope_reference(phi_q, *rope), apply_rope_reference(phi_k, *rope)
    return phi_q, phi_k, normaliser


def nala_attention_reference(q: Tensor, k: Tensor, v: Tensor, cfg: NaLaConfig,
                             rope: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
    """Linear-cost NaLa attention; ``rope`` is an optional ``(cos, sin)`` table ``(N, d/2)``."""
    phi_q, phi_k, normaliser = _rotated_features(q, k, cfg, rope)
    state = phi_k.transpose(-1, -2) @ v / k.shape[-2]  # (2d, d): linear in N
    return (phi_q @ state) * normaliser


def nala_attention_matrix(q: Tensor, k: Tensor, cfg: NaLaConfig,
                          rope: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
    """The implied N x N attention, for tests and inspection only (quadratic memory)."""
    phi_q, phi_k, normaliser = _rotated_features(q, k, cfg, rope)
    return (phi_q @ phi_k.transpose(-1, -2)) * normaliser / k.shape[-2]
