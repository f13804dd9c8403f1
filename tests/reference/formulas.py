"""The attention formulas written out in plain torch, one token at a time where that reads
clearer, for checking the package against. Imports nothing from ``nala_mm`` (a test greps it).

Written from the method (docs/user_guides/method.md), not from the package:

* NaLa query: rho = ||q||, u = q / rho, p = lam (tau + tanh rho) (a fixed p without norm
  awareness); magnitude |u|^p. A zero query has zero features.
* NaLa key: magnitude |k|^3.
* Making the kernel non-negative:
  - paper ('cosine'): theta(x) = (pi/4) tanh(alpha x / ||x||) per component, features
    [m cos theta ; m sin theta] (the angle of the query is taken from u = q / ||q||, of the key
    from k / ||k||);
  - released ('relu'): [m 1(x > 0) ; m 1(x < 0)];
  - ablation ('positive'): m 1(x > 0).
* Linear attention baselines: phi = relu(x) or 1 + elu(x).
* Output: z_t = 1 / (phi(q_t) . mean_j phi(k_j) + eps), S = (1/N) sum_j rot(phi(k_j)) v_j^T,
  o_t = (rot(phi(q_t)) S) z_t, where rot is the 2D RoPE applied to each d-wide block of a
  feature separately.
* 2D RoPE for head dim d: d/4 frequencies f_i = 10000^(-i / (d/4 - 1)) (f_0 = 1 when d/4 = 1);
  channel pair (2i, 2i+1) for i < d/4 turns by row * f_i, pair (2i, 2i+1) for d/4 <= i < d/2
  by col * f_(i - d/4); a pair (a, b) turned by angle t is (a cos t - b sin t, a sin t + b cos t).
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor


# ------------------------------------------------------------------------------------ RoPE
def rope_angles(height: int, width: int, head_dim: int,
                dtype: torch.dtype = torch.float64) -> Tensor:
    """Angle of every (token, channel pair): ``(H*W, d/2)``, tokens in row-major order."""
    quarter = head_dim // 4
    freqs = [10000.0 ** (-(i / (quarter - 1))) if quarter > 1 else 1.0 for i in range(quarter)]
    angles = torch.empty(height * width, 2 * quarter, dtype=dtype)
    for row in range(height):
        for col in range(width):
            token = row * width + col
            for i, f in enumerate(freqs):
                angles[token, i] = row * f
                angles[token, quarter + i] = col * f
    return angles


def rope_tables(height: int, width: int, head_dim: int,
                dtype: torch.dtype = torch.float64) -> Tuple[Tensor, Tensor]:
    """``(cos, sin)``, each ``(H*W, d/2)``: the tables the package's ops take as ``rope``."""
    angles = rope_angles(height, width, head_dim, dtype)
    return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Turn every channel pair of each ``2 * cos.shape[-1]``-wide block of ``x (..., N, D)``."""
    block = 2 * cos.shape[-1]
    out = []
    for start in range(0, x.shape[-1], block):
        part = x[..., start:start + block]
        a, b = part[..., 0::2], part[..., 1::2]
        turned = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
        out.append(turned.reshape(part.shape))
    return torch.cat(out, dim=-1)


# ---------------------------------------------------------------------------- feature maps
def _split(magnitude: Tensor, x: Tensor, kernel: str, alpha: float) -> Tensor:
    if kernel == 'relu':
        return torch.cat([magnitude * (x > 0), magnitude * (x < 0)], dim=-1)
    if kernel == 'positive':
        return magnitude * (x > 0)
    if kernel == 'cosine':
        norm = x.norm(dim=-1, keepdim=True)
        unit = torch.where(norm > 0, x / torch.where(norm > 0, norm, torch.ones_like(norm)),
                           torch.zeros_like(x))
        theta = (math.pi / 4) * torch.tanh(alpha * unit)
        return torch.cat([magnitude * torch.cos(theta), magnitude * torch.sin(theta)], dim=-1)
    raise ValueError(kernel)


def nala_query_features(q: Tensor, kernel: str, alpha: float = 20.0, lam: float = 3.0,
                        tau: float = 0.5, fixed_power: Optional[float] = None,
                        rms: bool = False) -> Tensor:
    """``rms``: the exponent reads the components' root mean square, ``||q|| / sqrt(d)``."""
    rho = q.norm(dim=-1, keepdim=True)
    safe = torch.where(rho > 0, rho, torch.ones_like(rho))
    u = torch.where(rho > 0, q / safe, torch.zeros_like(q))
    read = (q.square().mean(dim=-1, keepdim=True)).sqrt() if rms else rho
    p = lam * (tau + torch.tanh(read)) if fixed_power is None else torch.full_like(rho, fixed_power)
    return _split(u.abs() ** p, u, kernel, alpha)


def nala_key_features(k: Tensor, kernel: str, alpha: float = 20.0) -> Tensor:
    return _split(k.abs() ** 3, k, kernel, alpha)


def linear_features(x: Tensor, name: str) -> Tensor:
    if name == 'relu':
        return torch.clamp(x, min=0)
    if name == 'elu':
        return torch.where(x > 0, x + 1, torch.exp(x))  # 1 + elu(x)
    raise ValueError(name)


# ------------------------------------------------------------------------------- attention
def kernelized(phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float = 1e-6,
               rope: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
    """Output of kernelised attention, token by token: ``(..., N, d)``."""
    n = phi_k.shape[-2]
    key_mean = phi_k.sum(dim=-2) / n  # (..., e*d)
    rq, rk = (phi_q, phi_k) if rope is None else (rotate(phi_q, *rope), rotate(phi_k, *rope))
    state = torch.zeros(*phi_k.shape[:-2], phi_k.shape[-1], v.shape[-1], dtype=v.dtype)
    for j in range(n):
        state = state + rk[..., j, :, None] * v[..., j, None, :]
    state = state / n
    rows = []
    for t in range(phi_q.shape[-2]):
        z = 1.0 / ((phi_q[..., t, :] * key_mean).sum(-1, keepdim=True) + eps)
        rows.append((rq[..., t, :, None] * state).sum(-2) * z)
    return torch.stack(rows, dim=-2)


def nala(q: Tensor, k: Tensor, v: Tensor, kernel: str = 'cosine', alpha: float = 20.0,
         lam: float = 3.0, tau: float = 0.5, eps: float = 1e-6,
         rope: Optional[Tuple[Tensor, Tensor]] = None,
         fixed_power: Optional[float] = None, rms: bool = False) -> Tensor:
    """Norm-aware linear attention on ``(B, heads, N, d)``."""
    return kernelized(nala_query_features(q, kernel, alpha, lam, tau, fixed_power, rms),
                      nala_key_features(k, kernel, alpha), v, eps, rope)


def linear(q: Tensor, k: Tensor, v: Tensor, feature_map: str = 'relu', eps: float = 1e-6,
           rope: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
    """Plain linear attention on ``(B, heads, N, d)``."""
    return kernelized(linear_features(q, feature_map), linear_features(k, feature_map), v, eps,
                      rope)
