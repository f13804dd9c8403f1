"""Kernelised attention over tokens split across ranks: the step between state and readout.

The state ``sum_j rope(phi(k_j))^T v_j`` and the key sum ``sum_j phi(k_j)`` are sums over
tokens, so global attention over every rank's tokens needs only their sum over the ranks (one
all-reduce per layer) and the global token count as the divisor; the queries stay local. Both
modes (:mod:`.naive`, :mod:`.custom_ops`) take a :class:`GlobalKeys` and apply it here.
"""
from dataclasses import dataclass
from typing import Callable, List, Sequence, Tuple

from torch import Tensor

from .rope import Rope


@dataclass(frozen=True)
class GlobalKeys:
    """How this rank's keys relate to the whole set.

    Attributes:
        total: the tokens of every rank together (the means' divisor).
        skip: leading keys this rank leaves out of its sums: tokens every rank holds (a ViT's
            class token) are counted by one rank only.
        reduce_sum: the differentiable sum over the ranks of a list of tensors.
    """
    total: int
    skip: int
    reduce_sum: Callable[[Sequence[Tensor]], List[Tensor]]

    def own_keys(self, k: Tensor, v: Tensor, rope: Rope) -> Tuple[Tensor, Tensor, Rope]:
        """The keys, values and RoPE rows this rank adds to the sums."""
        if not self.skip:
            return k, v, rope
        return (k[..., self.skip:, :], v[..., self.skip:, :],
                None if rope is None else tuple(t[self.skip:] for t in rope))

    def means(self, state: Tensor, key_sum: Tensor) -> Tuple[Tensor, Tensor]:
        """The state's and the key sum's global means from this rank's sums."""
        state, key_sum = self.reduce_sum([state, key_sum])
        return state / self.total, key_sum / self.total
