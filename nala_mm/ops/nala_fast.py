"""NaLa attention, fast path: one autograd node with a hand-written backward.

Why: the plain form (:mod:`.nala_reference`) leaves autograd a dozen N x 2d temporaries per head
(ReLU copies, concatenations, powers, four RoPE rotations) and stores them all for backward.
Here the forward keeps only q, k, v and the tiny state (2d x d), the key mean and the per-token
normaliser; the backward recomputes the cheap element-wise features and applies the analytic
derivatives below. RoPE is one complex multiply over both halves of a feature.

Derivation (per head, F = phi, G = rope(F), kbar = mean_j F_k, z = 1/(F_q kbar + eps),
S = G_k^T v / N, o = (G_q S) z):
    dnum = dO z,        dz = sum(dO * G_q S) -> dden = -dz z^2
    dS = G_q^T dnum,    dG_q = dnum S^T,     dF_q = rope^-1(dG_q) + dden kbar^T
    dkbar = F_q^T dden, dv = G_k dS / N,     dG_k = v dS^T / N,  dF_k = rope^-1(dG_k) + dkbar / N
then the feature maps' own derivatives (see ``_query_features_backward``/``_key_features_backward``).
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from .nala_reference import NORM_FLOOR, NaLaConfig
from .rope2d import apply_rope, rope_phasor

QUARTER_PI = math.pi / 4


def _split(magnitude: Tensor, mask_or_theta: Tuple[Tensor, Tensor]) -> Tensor:
    """[m * a ; m * b] as one (..., N, 2d) tensor."""
    a, b = mask_or_theta
    return torch.cat([magnitude * a, magnitude * b], dim=-1)


def _query_parts(q: Tensor, cfg: NaLaConfig):
    rho = torch.linalg.vector_norm(q, dim=-1, keepdim=True)
    direction = q / rho.clamp_min(NORM_FLOOR)
    power = cfg.lam * (cfg.tau + torch.tanh(rho))
    magnitude = direction.abs().pow(power)
    return rho, direction, power, magnitude


def _gates(x: Tensor, direction: Tensor, cfg: NaLaConfig) -> Tuple[Tensor, Tensor]:
    """Per-component split weights: hard indicator (relu) or (cos, sin) of the inhibit angle."""
    if cfg.kernel == 'relu':
        positive = (x > 0).to(x.dtype)
        return positive, (x < 0).to(x.dtype)
    theta = QUARTER_PI * torch.tanh(cfg.alpha * direction)
    return torch.cos(theta), torch.sin(theta)


def _query_features(q: Tensor, cfg: NaLaConfig) -> Tensor:
    _, direction, _, magnitude = _query_parts(q, cfg)
    return _split(magnitude, _gates(direction, direction, cfg))


def _key_features(k: Tensor, cfg: NaLaConfig) -> Tensor:
    magnitude = k.abs().pow(3)
    direction = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(NORM_FLOOR)
    return _split(magnitude, _gates(k, direction, cfg))


def _magnitude_and_angle_grads(d_features: Tensor, magnitude: Tensor, gates, cfg: NaLaConfig,
                               direction: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
    """Gradient w.r.t. the magnitude m and w.r.t. the direction through the angle (cosine)."""
    d_first, d_second = d_features.chunk(2, dim=-1)
    a, b = gates
    d_magnitude = d_first * a + d_second * b
    if cfg.kernel == 'relu':
        return d_magnitude, None
    # d/dtheta of [m cos, m sin] = m [-sin, cos]; dtheta/du = (pi/4) alpha (1 - tanh^2(alpha u))
    d_theta = magnitude * (d_second * a - d_first * b)
    tanh_u = torch.tanh(cfg.alpha * direction)
    return d_magnitude, d_theta * (QUARTER_PI * cfg.alpha) * (1 - tanh_u * tanh_u)


def _through_normalisation(d_direction: Tensor, direction: Tensor, norm: Tensor) -> Tensor:
    """Backward of u = x / ||x|| (tangential part only)."""
    radial = (d_direction * direction).sum(dim=-1, keepdim=True)
    return (d_direction - direction * radial) / norm.clamp_min(NORM_FLOOR)


def _query_features_backward(q: Tensor, d_features: Tensor, cfg: NaLaConfig) -> Tensor:
    rho, direction, power, magnitude = _query_parts(q, cfg)
    gates = _gates(direction, direction, cfg)
    d_magnitude, d_direction = _magnitude_and_angle_grads(d_features, magnitude, gates, cfg,
                                                          direction)
    weighted = d_magnitude * magnitude  # dL/dm * m
    nonzero = direction != 0
    safe_direction = torch.where(nonzero, direction, torch.ones_like(direction))
    # m = |u|^p: dm/du = p m / u, dm/dp = m log|u| (both 0 where u = 0, since p > 1)
    d_u = torch.where(nonzero, power * weighted / safe_direction, 0.0)
    if d_direction is not None:
        d_u = d_u + d_direction
    d_power = (weighted * torch.where(nonzero, safe_direction.abs().log(), 0.0)).sum(-1, keepdim=True)
    tanh_rho = torch.tanh(rho)
    d_rho = d_power * cfg.lam * (1 - tanh_rho * tanh_rho)
    return _through_normalisation(d_u, direction, rho) + d_rho * direction


def _key_features_backward(k: Tensor, d_features: Tensor, cfg: NaLaConfig) -> Tensor:
    norm = torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    direction = k / norm.clamp_min(NORM_FLOOR)
    magnitude = k.abs().pow(3)
    gates = _gates(k, direction, cfg)
    d_magnitude, d_direction = _magnitude_and_angle_grads(d_features, magnitude, gates, cfg,
                                                          direction)
    d_k = d_magnitude * 3 * k * k.abs()  # d|k|^3/dk = 3 k |k|
    if d_direction is not None:
        d_k = d_k + _through_normalisation(d_direction, direction, norm)
    return d_k


def _rotate(x: Tensor, phasor: Optional[Tensor], inverse: bool = False) -> Tensor:
    return x if phasor is None else apply_rope(x, phasor, inverse=inverse)


class _NaLaFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, phasor: Optional[Tensor], cfg: NaLaConfig):
        n_tokens = k.shape[-2]
        phi_k = _key_features(k, cfg)
        key_mean = phi_k.mean(dim=-2, keepdim=True)  # (.., 1, 2d)
        state = _rotate(phi_k, phasor).transpose(-1, -2) @ v / n_tokens  # (.., 2d, d)
        del phi_k
        phi_q = _query_features(q, cfg)
        normaliser = 1.0 / (phi_q @ key_mean.transpose(-1, -2) + cfg.eps)  # (.., N, 1)
        out = (_rotate(phi_q, phasor) @ state) * normaliser
        ctx.save_for_backward(q, k, v, phasor, key_mean, state, normaliser)
        ctx.cfg = cfg
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor):
        q, k, v, phasor, key_mean, state, normaliser = ctx.saved_tensors
        cfg = ctx.cfg
        n_tokens = k.shape[-2]

        phi_q = _query_features(q, cfg)
        rot_q = _rotate(phi_q, phasor)
        d_num = d_out * normaliser
        # dden = -(sum dO * num) z^2 = -(sum dO_t * num_t) * z * z
        d_den = -((d_num * (rot_q @ state)).sum(-1, keepdim=True)) * normaliser
        d_state = rot_q.transpose(-1, -2) @ d_num
        del rot_q
        d_phi_q = _rotate(d_num @ state.transpose(-1, -2), phasor, inverse=True) + d_den * key_mean
        d_key_mean = d_den.transpose(-1, -2) @ phi_q  # (.., 1, 2d)
        del phi_q
        d_q = _query_features_backward(q, d_phi_q, cfg)
        del d_phi_q

        rot_k = _rotate(_key_features(k, cfg), phasor)
        d_v = rot_k @ d_state / n_tokens
        del rot_k
        d_phi_k = _rotate(v @ d_state.transpose(-1, -2) / n_tokens, phasor, inverse=True) \
            + d_key_mean / n_tokens
        d_k = _key_features_backward(k, d_phi_k, cfg)
        return d_q, d_k, d_v, None, None


def nala_attention(q: Tensor, k: Tensor, v: Tensor, cfg: NaLaConfig,
                   rope: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
    """NaLa attention on ``(B, heads, N, d)`` float32 tensors; ``rope`` = ``(cos, sin)``."""
    phasor = None if rope is None else rope_phasor(*rope)
    return _NaLaFunction.apply(q, k, v, phasor, cfg)
