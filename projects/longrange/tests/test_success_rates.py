"""Success-rate statistics (projects.longrange.success_rates) against independent computations:
Wilson's interval as the roots of its defining inequality, Barnard's test by enumerating every
table and maximising over the nuisance rate, Holm by hand, Firth's fit by a general optimiser on
the penalized likelihood written out here."""
import itertools
import math

import numpy as np
import pytest
from scipy import optimize, stats

from projects.longrange import success_rates as sr


@pytest.mark.parametrize('successes,runs', [(0, 10), (5, 10), (13, 20), (20, 20), (1, 3)])
def test_wilson_interval_is_where_the_score_test_accepts(successes, runs):
    """The interval is {p : |rate - p| <= z sqrt(p (1 - p) / n)}: its ends are the roots."""
    rate, z = successes / runs, stats.norm.ppf(0.975)

    def excess(p):
        return abs(rate - p) - z * math.sqrt(p * (1 - p) / runs)
    low = 0.0 if successes == 0 else optimize.brentq(excess, 1e-12, min(rate, 1 - 1e-12))
    high = 1.0 if successes == runs else optimize.brentq(excess, max(rate, 1e-12), 1 - 1e-12)
    assert sr.wilson_interval(successes, runs) == pytest.approx((low, high), abs=1e-9)


def test_wilson_interval_holds_the_rate_at_every_count():
    """Error bars are rate - low and high - rate (the graded report's plot): never negative,
    also at 0 and ``runs`` successes, where rounding once put 0 of 7's low end at 1e-17."""
    for runs in range(1, 41):
        for successes in range(runs + 1):
            low, high = sr.wilson_interval(successes, runs)
            assert 0.0 <= low <= successes / runs <= high <= 1.0, (successes, runs, low, high)
    assert sr.wilson_interval(0, 7)[0] == 0.0 and sr.wilson_interval(10, 10)[1] == 1.0


def test_wilson_interval_names_bad_counts():
    with pytest.raises(ValueError, match='got 11 of 10'):
        sr.wilson_interval(11, 10)


def brute_force_barnard(a: int, n: int, b: int, m: int) -> float:
    """Two-sided Barnard with the pooled score statistic: the largest, over the common rate, of
    the probability of the tables at least as extreme as the observed one."""
    def statistic(x, y):
        pooled = (x + y) / (n + m)
        var = pooled * (1 - pooled) * (1 / n + 1 / m)
        return 0.0 if var == 0 else (x / n - y / m) / math.sqrt(var)
    observed = abs(statistic(a, b))
    extreme = [(x, y) for x, y in itertools.product(range(n + 1), range(m + 1))
               if abs(statistic(x, y)) >= observed - 1e-12]
    rates = np.linspace(1e-6, 1 - 1e-6, 20001)
    return float(max(sum(stats.binom.pmf(x, n, rates) * stats.binom.pmf(y, m, rates)
                         for x, y in extreme)))


@pytest.mark.parametrize('a,n,b,m', [(2, 6, 6, 6), (1, 5, 4, 6), (3, 4, 3, 4)])
def test_barnard_matches_the_enumeration(a, n, b, m):
    assert sr.barnard_p(a, n, b, m) == pytest.approx(brute_force_barnard(a, n, b, m), abs=1e-6)
    assert sr.barnard_p(a, n, b, m) == pytest.approx(sr.barnard_p(b, m, a, n), abs=1e-9)


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, max(0.06, 1 x 0.04)
    assert sr.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert sr.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def firth_objective(beta, x, y):
    """Minus (log-likelihood + 0.5 log det X^T W X), written out independently."""
    p = 1 / (1 + np.exp(-(x @ beta)))
    loglik = np.sum(y * np.log(p) + (1 - y) * np.log(1 - p))
    return -(loglik + 0.5 * np.log(np.linalg.det(x.T @ np.diag(p * (1 - p)) @ x)))


def test_firth_fit_is_the_penalized_optimum_and_finite_under_separation():
    """Group 1 succeeds at every run (plain maximum likelihood would diverge); the level
    slope differs between groups."""
    rng = np.random.default_rng(0)
    group = np.repeat([0, 1], 30)
    level = np.tile(np.linspace(-1, 1, 30), 2)
    y = np.where(group == 1, 1.0, (rng.random(60) < 1 / (1 + np.exp(-2 * level))).astype(float))
    x = np.column_stack([np.ones(60), group, level, group * level])
    fit = sr.firth_logistic(x, y)
    reference = optimize.minimize(firth_objective, np.zeros(4), args=(x, y), method='BFGS',
                                  options=dict(gtol=1e-8))
    assert np.isfinite(fit['coef']).all()
    assert fit['coef'] == pytest.approx(reference.x, abs=1e-3)
    assert fit['penalized_loglik'] == pytest.approx(-reference.fun, abs=1e-6)


def test_penalized_likelihood_ratio_holds_the_interaction_at_zero_under_the_full_penalty():
    """The reduced fit is the full objective's optimum with the interaction fixed at 0."""
    rng = np.random.default_rng(1)
    group = np.repeat([0, 1], 40)
    level = np.tile(np.linspace(-1, 1, 40), 2)
    slope = np.where(group == 1, 3.0, 0.0)
    y = (rng.random(80) < 1 / (1 + np.exp(-slope * level))).astype(float)
    x = np.column_stack([np.ones(80), group, level, group * level])
    full, reduced = sr.firth_logistic(x, y), sr.firth_logistic(x, y, zero=[3])
    reference = optimize.minimize(lambda b: firth_objective(np.append(b, 0.0), x, y),
                                  np.zeros(3), method='BFGS', options=dict(gtol=1e-8))
    assert reduced['coef'][3] == 0 and reduced['coef'][:3] == pytest.approx(reference.x, abs=1e-3)
    p = sr.likelihood_ratio_p(full, reduced, 1)
    expected = stats.chi2.sf(2 * (full['penalized_loglik'] + reference.fun), 1)
    assert p == pytest.approx(expected, rel=1e-3) and p < 0.05  # the slopes do differ
