"""Feature maps of kernelised attention as small named objects, each in three forms.

A kernelised attention (NaLa, plain linear attention) turns every query and key into a
non-negative feature ``phi(x)`` and mixes values with ``phi(q) . phi(k)``. Each map here offers:

* ``forward(x)``  plain, differentiable tensor ops: the reference and the export paths;
* ``forward_(x)`` the same numbers without autograd, written into one buffer: the fast path;
* ``backward(x, d_phi)`` the analytic gradient w.r.t. ``x``, recomputing what it needs from ``x``
  (the fast path stores no feature for its backward);
* ``expansion``: the feature width over the head dim (the attention state is ``expansion*d x d``).

The fast path runs as torch custom ops (:mod:`.custom_ops`), which take tensors, strings and
numbers, not Python objects: a map travels as its registered name and its numbers
(:func:`feature_map_spec`) and is rebuilt inside the op (:func:`feature_map_from_spec`). Every
subclass of :class:`FeatureMap` registers itself on definition, so a user's map needs no call; a
map whose constructor takes arguments returns them from :meth:`FeatureMap.numbers`.

NaLa's maps (docs/user_guides/method.md, "Query norm x direction", "Cubed keys", "Cosine inhibit")
are composed of a magnitude (the query direction raised to a norm-dependent
power, or the cubed key) and a *sign split* that makes the feature non-negative: the released
ReLU split, the paper's cosine inhibit, or the positive part alone (an ablation that discards
signed interactions). Only the sign splits branch on the kernel; everything else is shared.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

# A query of exactly zero norm has no direction; its features are defined as zero (the
# released code divides 0 by 0 there).
NORM_FLOOR = 1e-12
QUARTER_PI = math.pi / 4


def _norm(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def _unit(x: Tensor) -> Tuple[Tensor, Tensor]:
    norm = _norm(x)
    return norm, x / norm.clamp_min(NORM_FLOOR)


def _through_normalisation(d_direction: Tensor, direction: Tensor, norm: Tensor,
                           d_norm: Optional[Tensor] = None) -> Tensor:
    """Backward of ``u = x / ||x||`` (plus an optional gradient on ``||x||`` itself):
    ``dx = du / ||x|| + u (d||x|| - (u . du) / ||x||)``."""
    safe_norm = norm.clamp_min(NORM_FLOOR)
    coef = (d_direction * direction).sum(dim=-1, keepdim=True).div_(safe_norm).neg_()
    if d_norm is not None:
        coef = coef.add_(d_norm)
    return torch.addcmul(d_direction / safe_norm, direction, coef)


# ------------------------------------------------------------------------------- sign splits
class SignSplit:
    """Non-negative magnitude ``m`` and signed source ``x`` -> the feature
    (docs/user_guides/method.md, "Cosine inhibit")."""
    name = ''
    expansion = 2
    uses_direction = False  # whether it reads the unit direction of x besides its sign

    def split(self, magnitude: Tensor, source: Tensor, direction: Optional[Tensor]) -> Tensor:
        raise NotImplementedError

    def split_(self, magnitude: Tensor, source: Tensor, direction: Optional[Tensor]) -> Tensor:
        raise NotImplementedError

    def split_backward(self, d_features: Tensor, magnitude: Tensor, source: Tensor,
                       direction: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        """Gradients w.r.t. the magnitude and (``uses_direction``) the direction."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, alpha: float) -> 'SignSplit':
        """Built from NaLa's settings; only the cosine inhibit reads ``alpha``."""
        return cls()

    def __repr__(self) -> str:
        return self.name


class ReLUSplit(SignSplit):
    """``[m 1(x > 0) ; m 1(x < 0)]``: the released code (the cosine inhibit's limit alpha ->
    inf). In the fast form ``m (1 +- sign x) / 2``: ``torch.where`` is far slower on CPU, and
    ``m = 0`` wherever ``x = 0`` (both magnitudes vanish there)."""
    name = 'relu'

    def split(self, magnitude, source, direction=None):
        return torch.cat([magnitude * (source > 0), magnitude * (source < 0)], dim=-1)

    def split_(self, magnitude, source, direction=None):
        dims = magnitude.shape[-1]
        out = magnitude.new_empty(*magnitude.shape[:-1], 2 * dims)
        first, second = out[..., :dims], out[..., dims:]
        torch.addcmul(magnitude, magnitude, source.sign(), value=1.0, out=first).mul_(0.5)
        torch.sub(magnitude, first, out=second)
        return out

    def split_backward(self, d_features, magnitude, source, direction=None):
        dims = magnitude.shape[-1]
        d_first, d_second = d_features[..., :dims], d_features[..., dims:]
        return torch.addcmul(d_first + d_second, d_first - d_second,
                             source.sign()).mul_(0.5), None


class PositivePart(SignSplit):
    """``m 1(x > 0)``: keeps only same-sign positive interactions (ablation: negative
    components, and every signed interaction through them, are discarded)."""
    name = 'positive'
    expansion = 1

    def split(self, magnitude, source, direction=None):
        return magnitude * (source > 0)

    def split_(self, magnitude, source, direction=None):
        return torch.addcmul(magnitude, magnitude, source.sign()).mul_(0.5)

    def split_backward(self, d_features, magnitude, source, direction=None):
        return torch.addcmul(d_features, d_features, source.sign()).mul_(0.5), None


class CosineInhibit(SignSplit):
    """``[m cos theta ; m sin theta]`` with ``theta = (pi/4) tanh(alpha u)`` per component of
    the unit direction u: the paper's form. Same-sign pairs interact fully, opposite-sign pairs
    are inhibited, and ``||[m cos, m sin]|| = m``."""
    name = 'cosine'
    uses_direction = True

    def __init__(self, alpha: float):
        self.alpha = alpha

    @classmethod
    def from_config(cls, alpha: float) -> 'CosineInhibit':
        return cls(alpha)

    def _theta(self, direction: Tensor) -> Tensor:
        return torch.tanh(self.alpha * direction) * QUARTER_PI

    def split(self, magnitude, source, direction=None):
        theta = self._theta(direction)
        return torch.cat([magnitude * torch.cos(theta), magnitude * torch.sin(theta)], dim=-1)

    def split_(self, magnitude, source, direction=None):
        dims = magnitude.shape[-1]
        out = magnitude.new_empty(*magnitude.shape[:-1], 2 * dims)
        theta = self._theta(direction)
        torch.mul(magnitude, torch.cos(theta), out=out[..., :dims])
        torch.mul(magnitude, theta.sin_(), out=out[..., dims:])
        return out

    def split_backward(self, d_features, magnitude, source, direction=None):
        dims = magnitude.shape[-1]
        d_first, d_second = d_features[..., :dims], d_features[..., dims:]
        tanh_u = torch.tanh(self.alpha * direction)
        theta = tanh_u * QUARTER_PI
        cos, sin = torch.cos(theta), theta.sin_()
        d_magnitude = d_first * cos + d_second * sin
        # d/dtheta [m cos, m sin] = m [-sin, cos]; dtheta/du = (pi/4) alpha (1 - tanh^2(alpha u))
        d_theta = (d_second * cos).sub_(d_first * sin).mul_(magnitude)
        slope = tanh_u.square_().neg_().add_(1.0).mul_(QUARTER_PI * self.alpha)
        return d_magnitude, d_theta.mul_(slope)

    def __repr__(self) -> str:
        return f'cosine(alpha={self.alpha:g})'


# kernel name -> sign split; the cosine inhibit takes the sharpness alpha, the others nothing
SIGN_SPLITS = {'cosine': CosineInhibit, 'relu': ReLUSplit, 'positive': PositivePart}


def build_sign_split(kernel: str, alpha: float = 20.0) -> SignSplit:
    if kernel not in SIGN_SPLITS:
        raise ValueError(f'unknown NaLa kernel {kernel!r}; expected one of {tuple(SIGN_SPLITS)}')
    return SIGN_SPLITS[kernel].from_config(alpha)


def _split_numbers(split: SignSplit) -> Tuple[float, float]:
    """A sign split as ``(index in SIGN_SPLITS, alpha)`` (alpha 0 where it reads none)."""
    return float(tuple(SIGN_SPLITS).index(split.name)), float(getattr(split, 'alpha', 0.0))


def _split_from_numbers(index: float, alpha: float) -> SignSplit:
    return build_sign_split(tuple(SIGN_SPLITS)[int(index)], alpha)


# --------------------------------------------------------------------------- token features
# log|0| = -inf is clamped here so that exp(p * log|u|) is exactly 0 for every p > 1e-4 and,
# like pow, 1 for p = 0 (never 0 * inf = nan).
LOG_FLOOR = -1e4


def _log_abs(x: Tensor) -> Tensor:
    """``log|x|``, floored at ``LOG_FLOOR`` (finite where x = 0)."""
    return x.abs().log_().clamp_min_(LOG_FLOOR)


def _power_of_abs(x: Tensor, power: Tensor) -> Tensor:
    """``|x| ** power`` with a per-row exponent, as ``exp(power * log|x|)``: on CPU a pow with
    a tensor exponent is a scalar loop, log and exp are vectorised."""
    return _log_abs(x).mul_(power).exp_()


# registered name (module and qualified name of the class) -> FeatureMap subclass
FEATURE_MAPS: Dict[str, type] = {}


def _registered_name(cls: type) -> str:
    return f'{cls.__module__}.{cls.__qualname__}'


class FeatureMap:
    """Per-token feature ``phi(x)`` of kernelised attention (module docstring).

    ``flops_per_feature``: the element-wise work per output element the FLOP counter charges
    (an elementary function counts as one flop; see :mod:`nala_mm.analysis`).

    A subclass registers itself under its module and qualified name (a class defined again
    under the same name replaces the earlier one).
    """
    expansion = 1
    flops_per_feature = 1

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        FEATURE_MAPS[_registered_name(cls)] = cls

    def numbers(self) -> Tuple[float, ...]:
        """The constructor's arguments as Python floats: ``type(self).from_numbers(m.numbers())``
        rebuilds an equal map (compute them in the constructor: they are read at every call).
        A map built without arguments has none; one whose constructor takes arguments must say
        which (else its fast op could not rebuild it)."""
        if type(self).__init__ is not object.__init__:
            raise TypeError(f'{type(self).__name__} takes constructor arguments but does not '
                            'define numbers(): return them (and from_numbers, if they are not '
                            'its positional arguments) so that the fast op can rebuild the map')
        return ()

    @classmethod
    def from_numbers(cls, numbers: Sequence[float]) -> 'FeatureMap':
        return cls(*numbers)

    def forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward_(self, x: Tensor) -> Tensor:
        return self.forward(x)

    def backward(self, x: Tensor, d_features: Tensor) -> Tensor:
        raise NotImplementedError


# what the exponent's tanh reads: the query norm itself, or its root mean square over the head
# dim (||q|| / sqrt(d))
QUERY_NORMS = ('raw', 'rms')


class NormAwareQuery(FeatureMap):
    """NaLa's query feature: the direction ``u = q/||q||`` raised per token to
    ``p = lam (tau + tanh(||q|| / s))`` (or a fixed ``p`` without norm awareness), then split.
    ``s`` is 1 (``query_norm='raw'``, the paper) or ``sqrt(d)`` (``'rms'``)."""
    # norm, divide, power, angle, cos and sin, two products: ~8 per component, shared by its
    # two outputs (the relu split does less; counted alike so the count depends on shapes)
    flops_per_feature = 4

    def __init__(self, split: SignSplit, lam: float, tau: float, norm_aware: bool = True,
                 fixed_power: float = 3.0, query_norm: str = 'raw'):
        if query_norm not in QUERY_NORMS:
            raise ValueError(f'query_norm must be one of {QUERY_NORMS}, got {query_norm!r}')
        self.split, self.lam, self.tau = split, lam, tau
        self.norm_aware, self.fixed_power = norm_aware, fixed_power
        self.query_norm = query_norm
        self.expansion = split.expansion
        self._numbers = (*_split_numbers(split), float(lam), float(tau), float(norm_aware),
                         float(fixed_power), float(QUERY_NORMS.index(query_norm)))

    def numbers(self):
        return self._numbers

    @classmethod
    def from_numbers(cls, numbers):
        index, alpha, lam, tau, norm_aware, fixed_power, query_norm = numbers
        return cls(_split_from_numbers(index, alpha), lam, tau, bool(norm_aware), fixed_power,
                   QUERY_NORMS[int(query_norm)])

    def norm_scale(self, dims: int) -> float:
        """``s``: what the query norm is measured against before tanh."""
        return math.sqrt(dims) if self.query_norm == 'rms' else 1.0

    def power(self, rho: Tensor, dims: int) -> Tensor:
        """The exponent of queries of norm ``rho`` and head dim ``dims``."""
        if self.norm_aware:
            return torch.tanh(rho / self.norm_scale(dims)).add(self.tau).mul(self.lam)
        return torch.full_like(rho, self.fixed_power)

    def norm_at_power(self, power: float, dims: int) -> float:
        """The query norm whose exponent is ``power`` (the inverse of :meth:`power`; 0 for a
        power at or below the floor ``lam tau``, ``inf`` at or above the ceiling)."""
        level = power / self.lam - self.tau  # tanh(rho / s)
        if level <= 0.0:
            return 0.0
        if level >= 1.0:
            return math.inf
        return math.atanh(level) * self.norm_scale(dims)

    def forward(self, q):
        rho, direction = _unit(q)
        return self.split.split(direction.abs() ** self.power(rho, q.shape[-1]), direction,
                                direction)

    def forward_(self, q):
        rho, direction = _unit(q)
        return self.split.split_(_power_of_abs(direction, self.power(rho, q.shape[-1])),
                                 direction, direction)

    def backward(self, q, d_features):
        rho, direction = _unit(q)
        scale = self.norm_scale(q.shape[-1])
        power = self.power(rho, q.shape[-1])
        log_abs = _log_abs(direction)  # shared by m = exp(p log|u|) and dm/dp = m log|u|
        magnitude = torch.mul(log_abs, power).exp_()
        d_magnitude, d_angle = self.split.split_backward(d_features, magnitude, direction,
                                                         direction)
        weighted = d_magnitude.mul_(magnitude)  # dL/dm * m
        # m = |u|^p: dm/du = p m / u, dm/dp = m log|u|; both are 0 where u = 0 (p > 1, m = 0):
        # the floored log is finite there, and dividing by 1 instead of 0 needs no branch.
        d_rho = None
        if self.norm_aware:
            d_power = log_abs.mul_(weighted).sum(-1, keepdim=True)
            # d/drho lam tanh(rho / s) = lam (1 - tanh^2(rho / s)) / s
            d_rho = d_power.mul_(torch.tanh(rho / scale).square_().neg_().add_(1.0)).mul_(
                self.lam / scale)
        del log_abs
        safe_direction = direction + (direction == 0)
        d_u = weighted.div_(safe_direction).mul_(power)
        if d_angle is not None:
            d_u = d_u.add_(d_angle)
        return _through_normalisation(d_u, direction, rho, d_rho)

    def __repr__(self) -> str:
        reads = '|q|' if self.query_norm == 'raw' else '|q|/sqrt(d)'
        power = (f'p=lam(tau+tanh {reads}), lam={self.lam:g}, tau={self.tau:g}'
                 if self.norm_aware else f'p={self.fixed_power:g} (not norm-aware)')
        return f'NormAwareQuery({self.split!r}, {power})'


class CubedKey(FeatureMap):
    """NaLa's key feature: ``|k|^3``, split by the sign (or the direction) of k."""
    flops_per_feature = 4  # as NormAwareQuery

    def __init__(self, split: SignSplit):
        self.split = split
        self.expansion = split.expansion
        self._numbers = _split_numbers(split)

    def numbers(self):
        return self._numbers

    @classmethod
    def from_numbers(cls, numbers):
        return cls(_split_from_numbers(*numbers))

    def forward(self, k):
        direction = _unit(k)[1] if self.split.uses_direction else None
        return self.split.split(k.abs() ** 3, k, direction)

    def forward_(self, k):
        direction = _unit(k)[1] if self.split.uses_direction else None
        return self.split.split_(k.abs().pow_(3), k, direction)

    def backward(self, k, d_features):
        norm, direction = _unit(k) if self.split.uses_direction else (None, None)
        d_magnitude, d_angle = self.split.split_backward(d_features, k.abs().pow_(3), k,
                                                         direction)
        d_k = d_magnitude.mul_(k).mul_(k.abs()).mul_(3.0)  # d|k|^3/dk = 3 k |k|
        if d_angle is not None:
            d_k = d_k.add_(_through_normalisation(d_angle, direction, norm))
        return d_k

    def __repr__(self) -> str:
        return f'CubedKey({self.split!r})'


class ReLUFeature(FeatureMap):
    """``relu(x)``: plain linear attention's map. Positively homogeneous, so the query norm
    cancels between numerator and normaliser (the failure NaLa starts from)."""

    def forward(self, x):
        return F.relu(x)

    def backward(self, x, d_features):
        return d_features * (x > 0)

    def __repr__(self) -> str:
        return 'relu'


class ELUFeature(FeatureMap):
    """``1 + elu(x)``: the other classic positive map of linear attention."""
    flops_per_feature = 2  # exp on the negative side, the added one

    def forward(self, x):
        return F.elu(x) + 1.0

    def backward(self, x, d_features):
        # d(1 + elu)/dx = 1 for x > 0, exp(x) otherwise: exp(min(x, 0)) is both
        return d_features * torch.exp(x.clamp(max=0.0))

    def __repr__(self) -> str:
        return 'elu+1'


def feature_map_spec(feature_map: FeatureMap) -> Tuple[str, List[float]]:
    """What a fast op takes for ``feature_map``: its registered name and its numbers."""
    name = _registered_name(type(feature_map))
    if FEATURE_MAPS.get(name) is not type(feature_map):
        raise TypeError(f'{name} is not the FeatureMap registered under its name (a class '
                        'defined again replaces the earlier one): build the map from the '
                        'class defined last')
    # no float() here: traced with dynamic sizes, dynamo would lift float(x) of a float
    # attribute into a graph input (a map's numbers are constants of the graph)
    return name, list(feature_map.numbers())


def feature_map_from_spec(name: str, numbers: Sequence[float]) -> FeatureMap:
    """The map :func:`feature_map_spec` described."""
    if name not in FEATURE_MAPS:
        raise KeyError(f'no FeatureMap registered as {name!r}: define (import) its class in '
                       'this process before running the fast op')
    return FEATURE_MAPS[name].from_numbers(numbers)


# linear attention's feature_map name -> map
PLAIN_FEATURE_MAPS = {'relu': ReLUFeature, 'elu': ELUFeature}


def build_plain_feature_map(name: str) -> FeatureMap:
    if name not in PLAIN_FEATURE_MAPS:
        raise ValueError(f'unknown linear-attention feature_map {name!r}; expected one of '
                         f'{tuple(PLAIN_FEATURE_MAPS)}')
    return PLAIN_FEATURE_MAPS[name]()
