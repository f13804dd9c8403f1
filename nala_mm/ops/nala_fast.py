"""NaLa attention, fast path: one autograd node, a hand-written backward, tokens in chunks.

Why: the plain form (:mod:`.nala_reference`) leaves autograd a dozen N x 2d temporaries per head
(ReLU copies, concatenations, powers, four RoPE rotations) and stores them all for backward.
Here the forward keeps only q, k, v and the tiny state (2d x d), the key mean and the per-token
normaliser; the backward recomputes the cheap element-wise features and applies the analytic
derivatives below. Both passes walk the tokens in chunks (the state and the key mean are sums
over tokens), so the transient memory is O(chunk * d) instead of O(N * d). RoPE is one complex
multiply over both halves of a feature.

Derivation (per head, F = phi, G = rope(F), kbar = mean_j F_k, z = 1/(F_q kbar + eps),
S = G_k^T v / N, o = (G_q S) z):
    dnum = dO z,        dz = sum(dO * G_q S) -> dden = -dz z^2
    dS = G_q^T dnum,    dG_q = dnum S^T,     dF_q = rope^-1(dG_q) + dden kbar^T
    dkbar = F_q^T dden, dv = G_k dS / N,     dG_k = v dS^T / N,  dF_k = rope^-1(dG_k) + dkbar / N
then the feature maps' own derivatives (``_query_features_backward``/``_key_features_backward``).
"""
import math
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .nala_reference import NORM_FLOOR, NaLaConfig
from .rope2d import apply_rope, rope_phasor

QUARTER_PI = math.pi / 4
# Tokens per chunk: large enough that per-chunk overhead vanishes, small enough that the
# element-wise temporaries of a chunk stay in cache-sized blocks (4096 x 128 floats = 2 MiB).
DEFAULT_CHUNK = 4096


def _features(magnitude: Tensor, sign_source: Tensor, direction: Tensor,
              cfg: NaLaConfig) -> Tensor:
    """[m a ; m b] written straight into one (..., n, 2d) tensor (no concatenation copy).

    relu: (a, b) = (1[x > 0], 1[x < 0]), computed as m (1 +- sign x) / 2 (``torch.where`` is
    an order of magnitude slower on CPU; m = 0 where x = 0); cosine: (cos, sin) of the inhibit
    angle of the direction.
    """
    dims = magnitude.shape[-1]
    out = magnitude.new_empty(*magnitude.shape[:-1], 2 * dims)
    first, second = out[..., :dims], out[..., dims:]
    if cfg.kernel == 'relu':
        torch.addcmul(magnitude, magnitude, sign_source.sign(), value=1.0, out=first)
        first.mul_(0.5)
        torch.sub(magnitude, first, out=second)
    else:
        theta = torch.tanh(cfg.alpha * direction).mul_(QUARTER_PI)
        torch.mul(magnitude, torch.cos(theta), out=first)
        torch.mul(magnitude, theta.sin_(), out=second)
    return out


def _query_parts(q: Tensor, cfg: NaLaConfig):
    rho = torch.linalg.vector_norm(q, dim=-1, keepdim=True)
    direction = q / rho.clamp_min(NORM_FLOOR)
    power = torch.tanh(rho).add_(cfg.tau).mul_(cfg.lam)
    magnitude = direction.abs().pow_(power)
    return rho, direction, power, magnitude


def _query_features(q: Tensor, cfg: NaLaConfig) -> Tensor:
    _, direction, _, magnitude = _query_parts(q, cfg)
    return _features(magnitude, direction, direction, cfg)


def _key_parts(k: Tensor):
    norm = torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    return norm, k / norm.clamp_min(NORM_FLOOR), k.abs().pow_(3)


def _key_features(k: Tensor, cfg: NaLaConfig) -> Tensor:
    if cfg.kernel == 'relu':  # no direction needed
        return _features(k.abs().pow_(3), k, k, cfg)
    _, direction, magnitude = _key_parts(k)
    return _features(magnitude, k, direction, cfg)


def _magnitude_and_angle_grads(d_features: Tensor, magnitude: Tensor, sign_source: Tensor,
                               direction: Tensor, cfg: NaLaConfig
                               ) -> Tuple[Tensor, Optional[Tensor]]:
    """Gradient w.r.t. the magnitude m, and w.r.t. the direction through the angle (cosine)."""
    dims = magnitude.shape[-1]
    d_first, d_second = d_features[..., :dims], d_features[..., dims:]
    if cfg.kernel == 'relu':  # where(x > 0, d_first, d_second), without the slow where
        return torch.addcmul(d_first + d_second, d_first - d_second,
                             sign_source.sign()).mul_(0.5), None
    tanh_u = torch.tanh(cfg.alpha * direction)
    theta = tanh_u * QUARTER_PI
    cos, sin = torch.cos(theta), theta.sin_()
    d_magnitude = d_first * cos + d_second * sin
    # d/dtheta [m cos, m sin] = m [-sin, cos]; dtheta/du = (pi/4) alpha (1 - tanh^2(alpha u))
    d_theta = (d_second * cos).sub_(d_first * sin).mul_(magnitude)
    slope = tanh_u.square_().neg_().add_(1.0).mul_(QUARTER_PI * cfg.alpha)
    return d_magnitude, d_theta.mul_(slope)


def _through_normalisation(d_direction: Tensor, direction: Tensor, norm: Tensor,
                           d_norm: Optional[Tensor] = None) -> Tensor:
    """Backward of u = x / ||x|| (plus an optional gradient on ||x|| itself):
    dx = du / ||x|| + u (d||x|| - (u . du) / ||x||)."""
    safe_norm = norm.clamp_min(NORM_FLOOR)
    coef = (d_direction * direction).sum(dim=-1, keepdim=True).div_(safe_norm).neg_()
    if d_norm is not None:
        coef = coef.add_(d_norm)
    return torch.addcmul(d_direction / safe_norm, direction, coef)


def _query_features_backward(q: Tensor, d_features: Tensor, cfg: NaLaConfig) -> Tensor:
    rho, direction, power, magnitude = _query_parts(q, cfg)
    d_magnitude, d_angle = _magnitude_and_angle_grads(d_features, magnitude, direction,
                                                      direction, cfg)
    weighted = d_magnitude.mul_(magnitude)  # dL/dm * m
    # m = |u|^p: dm/du = p m / u, dm/dp = m log|u|; both are 0 where u = 0 (p > 1, m = 0),
    # which dividing by / taking the log of 1 there gives without a branch.
    safe_direction = direction + (direction == 0)
    d_power = (weighted * safe_direction.abs().log_()).sum(-1, keepdim=True)
    d_u = weighted.div_(safe_direction).mul_(power)
    if d_angle is not None:
        d_u = d_u.add_(d_angle)
    tanh_rho = torch.tanh(rho)
    d_rho = d_power.mul_(tanh_rho.square_().neg_().add_(1.0)).mul_(cfg.lam)
    return _through_normalisation(d_u, direction, rho, d_rho)


def _key_features_backward(k: Tensor, d_features: Tensor, cfg: NaLaConfig) -> Tensor:
    if cfg.kernel == 'relu':
        d_magnitude, _ = _magnitude_and_angle_grads(d_features, k, k, k, cfg)
        return d_magnitude.mul_(k).mul_(k.abs()).mul_(3.0)  # d|k|^3/dk = 3 k |k|
    norm, direction, magnitude = _key_parts(k)
    d_magnitude, d_angle = _magnitude_and_angle_grads(d_features, magnitude, k, direction, cfg)
    d_k = d_magnitude.mul_(k).mul_(k.abs()).mul_(3.0)
    return d_k.add_(_through_normalisation(d_angle, direction, norm))


def _rotate(x: Tensor, phasor: Optional[Tensor], inverse: bool = False) -> Tensor:
    return x if phasor is None else apply_rope(x, phasor, inverse=inverse)


def _chunks(n_tokens: int, chunk: int) -> Iterator[Tuple[int, int]]:
    for start in range(0, n_tokens, chunk):
        yield start, min(chunk, n_tokens - start)


def _rows(t: Optional[Tensor], start: int, length: int) -> Optional[Tensor]:
    """Token rows [start, start + length) of a (..., N, x) tensor or an (N, 1, x) phasor."""
    if t is None:
        return None
    return t.narrow(-3 if t.is_complex() else -2, start, length)


class _NaLaFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, phasor: Optional[Tensor],
                cfg: NaLaConfig, chunk: int):
        *batch, n_tokens, dims = q.shape
        key_sum = q.new_zeros(*batch, 1, 2 * dims)
        state = q.new_zeros(*batch, 2 * dims, v.shape[-1])
        for start, length in _chunks(n_tokens, chunk):
            phi_k = _key_features(_rows(k, start, length), cfg)
            key_sum += phi_k.sum(dim=-2, keepdim=True)
            rotated = _rotate(phi_k, _rows(phasor, start, length))
            state += rotated.transpose(-1, -2) @ _rows(v, start, length)
        key_mean = key_sum.div_(n_tokens)
        state = state.div_(n_tokens)

        out = q.new_empty(*batch, n_tokens, v.shape[-1])
        normaliser = q.new_empty(*batch, n_tokens, 1)
        for start, length in _chunks(n_tokens, chunk):
            phi_q = _query_features(_rows(q, start, length), cfg)
            z = torch.reciprocal((phi_q @ key_mean.transpose(-1, -2)).add_(cfg.eps))
            _rows(normaliser, start, length).copy_(z)
            rotated = _rotate(phi_q, _rows(phasor, start, length))
            torch.mul(rotated @ state, z, out=_rows(out, start, length))
        ctx.save_for_backward(q, k, v, phasor, key_mean, state, normaliser)
        ctx.cfg, ctx.chunk = cfg, chunk
        return out

    @staticmethod
    # The hand-written backward is not differentiable itself: refuse double backward rather
    # than return silently wrong second-order gradients.
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        q, k, v, phasor, key_mean, state, normaliser = ctx.saved_tensors
        cfg, chunk = ctx.cfg, ctx.chunk
        n_tokens = k.shape[-2]

        d_q = torch.empty_like(q)
        d_state = torch.zeros_like(state)
        d_key_mean = torch.zeros_like(key_mean)
        for start, length in _chunks(n_tokens, chunk):
            rope = _rows(phasor, start, length)
            phi_q = _query_features(_rows(q, start, length), cfg)
            rot_q = _rotate(phi_q, rope)
            z = _rows(normaliser, start, length)
            d_num = _rows(d_out, start, length) * z
            # dden = -(sum dO * num) z^2 = -(sum d_num * G_q S) z
            d_den = ((d_num * (rot_q @ state)).sum(-1, keepdim=True)).mul_(z).neg_()
            d_state += rot_q.transpose(-1, -2) @ d_num
            del rot_q
            d_phi_q = _rotate(d_num @ state.transpose(-1, -2), rope, inverse=True)
            d_phi_q.addcmul_(d_den, key_mean)
            d_key_mean += d_den.transpose(-1, -2) @ phi_q
            del phi_q
            _rows(d_q, start, length).copy_(_query_features_backward(
                _rows(q, start, length), d_phi_q, cfg))

        d_k, d_v = torch.empty_like(k), torch.empty_like(v)
        d_state.div_(n_tokens)
        d_key_mean.div_(n_tokens)
        for start, length in _chunks(n_tokens, chunk):
            rope = _rows(phasor, start, length)
            k_rows = _rows(k, start, length)
            rot_k = _rotate(_key_features(k_rows, cfg), rope)
            _rows(d_v, start, length).copy_(rot_k @ d_state)
            del rot_k
            d_phi_k = _rotate(_rows(v, start, length) @ d_state.transpose(-1, -2), rope,
                              inverse=True).add_(d_key_mean)
            _rows(d_k, start, length).copy_(_key_features_backward(k_rows, d_phi_k, cfg))
        return d_q, d_k, d_v, None, None, None


def nala_attention(q: Tensor, k: Tensor, v: Tensor, cfg: NaLaConfig,
                   rope: Optional[Tuple[Tensor, Tensor]] = None,
                   chunk: int = DEFAULT_CHUNK) -> Tensor:
    """NaLa attention on ``(B, heads, N, d)`` float32 tensors; ``rope`` = ``(cos, sin)``.

    ``chunk`` bounds the tokens processed at once (memory of the temporaries), not the result.
    """
    if chunk < 1:
        raise ValueError(f'chunk must be >= 1 token, got chunk={chunk}')
    phasor = None if rope is None else rope_phasor(*rope)
    return _NaLaFunction.apply(q, k, v, phasor, cfg, chunk)
