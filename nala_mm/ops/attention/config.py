"""NaLa's hyper-parameters and the feature maps they define (docs/user_guides/method.md, "Query
norm x direction", "Cubed keys", "Cosine inhibit").

NaLa is kernelised attention (:mod:`.naive`) with two maps: the query direction raised to
``p = lam (tau + tanh ||q||)`` and the cubed key, both made non-negative by the kernel's sign
split (``'cosine'``: the paper's cosine inhibit; ``'relu'``: the released code; ``'positive'``:
positive part only, an ablation).
"""
from dataclasses import dataclass
from typing import Tuple

from .feature_maps import QUERY_NORMS, SIGN_SPLITS, CubedKey, NormAwareQuery, build_sign_split

KERNELS = tuple(SIGN_SPLITS)


@dataclass(frozen=True)
class NaLaConfig:
    """Hyper-parameters of the norm-aware kernel.

    kernel:      ``'cosine'`` (paper), ``'relu'`` (released code) or ``'positive'`` (ablation:
                 signed interactions discarded).
    alpha:       sharpness of the cosine-inhibit angle ``(pi/4) tanh(alpha x/||x||)``.
    lam, tau:    query power ``p(rho) = lam * (tau + tanh(rho))``.
    eps:         added to the normaliser.
    norm_aware:  ``False`` replaces ``p(rho)`` by ``fixed_power`` (ablation: the output then no
                 longer depends on the query norm).
    fixed_power: the exponent without norm awareness; 3 is the middle of ``p``'s range [1.5, 4.5).
    query_norm:  what ``tanh`` reads: ``'raw'`` the query norm ``||q||`` (paper, released code) or
                 ``'rms'`` its root mean square over the head dim, ``||q|| / sqrt(d)`` (a variant
                 that keeps the exponent responsive where trained queries' norms sit past
                 tanh's knee; projects/longrange/README.md).
    """
    kernel: str = 'cosine'
    alpha: float = 20.0
    lam: float = 3.0
    tau: float = 0.5
    eps: float = 1e-6
    norm_aware: bool = True
    fixed_power: float = 3.0
    query_norm: str = 'raw'

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f'unknown NaLa kernel {self.kernel!r}; expected one of {KERNELS}')
        for name in ('alpha', 'lam', 'fixed_power'):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f'NaLa {name} must be > 0, got {name}={value}')
        if self.tau < 0:
            raise ValueError(f'NaLa tau must be >= 0 (the power must stay positive), got '
                             f'tau={self.tau}')
        if not self.eps > 0:
            raise ValueError(f'NaLa eps must be > 0, got eps={self.eps}')
        if self.query_norm not in QUERY_NORMS:
            raise ValueError(f'NaLa query_norm must be one of {QUERY_NORMS}, got '
                             f'query_norm={self.query_norm!r}')
        if not isinstance(self.norm_aware, bool):
            raise TypeError(f'NaLa norm_aware must be True or False, got {self.norm_aware!r}')

    def feature_maps(self) -> Tuple[NormAwareQuery, CubedKey]:
        split = build_sign_split(self.kernel, self.alpha)
        return (NormAwareQuery(split, self.lam, self.tau, self.norm_aware, self.fixed_power,
                               self.query_norm),
                CubedKey(split))
