"""Success rates of training runs that either find a solution or do not: intervals, exact
two-sample tests, a multiple-comparison correction, and a logistic model robust to rates of 0 or
1 (graded.py grades token mixers with them).

Bimodal outcomes (a run finds the long-range exemplar or stays at chance) make means over a few
seeds rank nothing; counts of successes do, with the statistics below.
"""
import math
from typing import Dict, List, Sequence, Tuple

import numpy as np
from scipy import optimize, stats

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile
NUISANCE_POINTS = 512  # Barnard's test: common rates tried for the largest p-value


def wilson_interval(successes: int, runs: int, z: float = Z95) -> Tuple[float, float]:
    """Wilson's score interval for a binomial rate (95 % by default): unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0 or ``runs`` successes."""
    if runs <= 0 or not 0 <= successes <= runs:
        raise ValueError(f'need 0 <= successes <= runs and runs > 0, got {successes} of {runs}')
    rate = successes / runs
    centre = (rate + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z / (1 + z * z / runs) * math.sqrt(rate * (1 - rate) / runs + z * z / (4 * runs ** 2))
    # at 0 or ``runs`` successes one end is the rate itself, which rounding can miss by an ulp
    # (0 of 7: a low end of 1e-17); the interval always holds the rate
    return min(rate, max(0.0, centre - half)), max(rate, min(1.0, centre + half))


def barnard_p(successes_a: int, runs_a: int, successes_b: int, runs_b: int) -> float:
    """Two-sided p-value of Barnard's exact unconditional test that two success rates are equal
    (more powerful than Fisher's at small counts): the largest, over the common rate, of the
    probability of every table whose pooled score statistic is at least as far from 0 as the
    observed one's.

    Written out rather than taken from ``scipy.stats.barnard_exact``, which (scipy 1.17) drops
    tables *tied* with the observed statistic when rounding puts them a hair below it: at 2 of 6
    against 6 of 6 it answers 0.0187 where the test's definition gives 0.0210."""
    for successes, runs in ((successes_a, runs_a), (successes_b, runs_b)):
        if runs <= 0 or not 0 <= successes <= runs:
            raise ValueError(f'need 0 <= successes <= runs and runs > 0, got {successes} of '
                             f'{runs}')
    xa, xb = np.meshgrid(np.arange(runs_a + 1), np.arange(runs_b + 1), indexing='ij')
    pooled = (xa + xb) / (runs_a + runs_b)
    variance = pooled * (1 - pooled) * (1 / runs_a + 1 / runs_b)
    with np.errstate(divide='ignore', invalid='ignore'):
        score = np.where(variance > 0, (xa / runs_a - xb / runs_b) / np.sqrt(variance), 0.0)
    observed = abs(score[successes_a, successes_b])
    extreme = np.abs(score) >= observed - 1e-9 * max(1.0, observed)

    def probability(rate: float) -> float:
        table = np.outer(stats.binom.pmf(np.arange(runs_a + 1), runs_a, rate),
                         stats.binom.pmf(np.arange(runs_b + 1), runs_b, rate))
        return float(table[extreme].sum())
    grid = np.linspace(0.0, 1.0, NUISANCE_POINTS + 1)[1:-1]
    values = [probability(rate) for rate in grid]
    best = int(np.argmax(values))  # then refined between the neighbouring grid points
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    refined = optimize.minimize_scalar(lambda rate: -probability(rate), bounds=(low, high),
                                       method='bounded', options=dict(xatol=1e-10))
    return min(1.0, max(values[best], -float(refined.fun)))


def holm(p_values: Sequence[float]) -> List[float]:
    """Holm's step-down adjusted p-values (family-wise error control), in the input's order:
    the k-th smallest is multiplied by (m - k + 1), kept monotone and capped at 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def firth_logistic(x: np.ndarray, y: np.ndarray, zero: Sequence[int] = (), iters: int = 100,
                   tol: float = 1e-10) -> Dict[str, object]:
    """Logistic regression with Firth's penalty (the log-likelihood plus half the log-determinant
    of the Fisher information), which keeps the estimates finite when a group succeeds or fails
    at every run, where plain maximum likelihood diverges. ``x`` is the design matrix (include
    an intercept column), ``y`` 0/1; the coefficients of the columns in ``zero`` are held at 0
    (the penalty still uses all of ``x``: the nested model of a penalized likelihood-ratio test,
    as Heinze and Schemper 2002 fit it). Returns ``coef`` and ``penalized_loglik``; fitted by
    Newton's method on the modified score (Firth 1993), step-halved on the penalized
    likelihood."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f'need x of shape (n, k) and y of shape (n,), got {x.shape} and '
                         f'{y.shape}')
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(f'y must hold 0 and 1 only, got {sorted(set(y.tolist()))}')
    beta = np.zeros(x.shape[1])
    free = np.setdiff1d(np.arange(x.shape[1]), np.asarray(zero, dtype=int))
    current = penalized_loglik(x, y, beta)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-x @ beta))
        w = p * (1 - p)
        info = x.T @ (x * w[:, None])
        info_inv = np.linalg.pinv(info)
        hat = np.einsum('ij,jk,ik->i', x * w[:, None], info_inv, x)  # leverages of W^1/2 X
        score = x.T @ (y - p + hat * (0.5 - p))
        step = np.zeros_like(beta)
        step[free] = np.linalg.pinv(info[np.ix_(free, free)]) @ score[free]
        for _ in range(50):  # halve the step until the penalized likelihood does not fall
            candidate = beta + step
            value = penalized_loglik(x, y, candidate)
            if value >= current - 1e-12:
                break
            step = step / 2
        beta, moved, current = candidate, float(np.abs(step).max()), value
        if moved < tol:
            break
    return dict(coef=beta, penalized_loglik=current)


def penalized_loglik(x: np.ndarray, y: np.ndarray, beta: np.ndarray) -> float:
    """Firth's objective: the Bernoulli log-likelihood plus 0.5 log det of X^T W X."""
    eta = x @ beta
    loglik = float(np.sum(y * eta - np.logaddexp(0.0, eta)))
    p = 1.0 / (1.0 + np.exp(-eta))
    info = x.T @ (x * (p * (1 - p))[:, None])
    sign, logdet = np.linalg.slogdet(info)
    return loglik + 0.5 * logdet if sign > 0 else -math.inf


def likelihood_ratio_p(full: Dict[str, object], reduced: Dict[str, object],
                       extra_terms: int) -> float:
    """Chi-square p-value of the penalized likelihood-ratio test that ``extra_terms``
    coefficients are 0: ``full`` against ``reduced``, both from :func:`firth_logistic` on the
    same ``x``, ``reduced`` with those coefficients in ``zero``."""
    statistic = max(0.0, 2 * (full['penalized_loglik'] - reduced['penalized_loglik']))
    return float(stats.chi2.sf(statistic, extra_terms))
