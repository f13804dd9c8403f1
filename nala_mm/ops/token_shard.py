"""The one place the ops and the models learn that an image's rows are split across ranks.

:class:`nala_mm.parallel.TokenParallel` activates a :class:`TokenShard` for the duration of its
call (:func:`sharded`); the kernelised attention, the row-padded convolutions, the BatchNorm
statistics and the ViT's position embedding ask :func:`active_shard` and, while it is ``None``
(every call outside TokenParallel), run their single-process path unchanged. The interface
lives here, below the models, so that nothing imports torch.distributed code until a user
imports :mod:`nala_mm.parallel`.
"""
from contextlib import contextmanager, nullcontext
from typing import Iterator, List, Optional, Sequence, Tuple

from torch import Tensor, nn

_ACTIVE: List['TokenShard'] = []


class TokenShard:
    """This rank's stripe of one image, and the group's collectives the ops need."""

    def reduce_sum(self, tensors: Sequence[Tensor]) -> List[Tensor]:
        """Each tensor summed over the group, differentiably (the backward sums the gradients
        of every rank)."""
        raise NotImplementedError

    def halo(self, x: Tensor, rows: int) -> Tensor:
        """A ``(B, C, h, W)`` map with ``rows`` rows of the neighbouring ranks above and below
        (zeros beyond the image); the backward returns each halo row's gradient to its owner."""
        raise NotImplementedError

    def grid_rows(self, module: nn.Module) -> Tuple[int, int]:
        """``(first, total)``: the global index of this rank's first token row at ``module``'s
        resolution, and the image's token rows there."""
        raise NotImplementedError

    @property
    def holds_prefix_keys(self) -> bool:
        """Whether this rank adds the prefix tokens' (a ViT's class token's) keys and values to
        the attention state: every rank holds them, one rank counts them."""
        raise NotImplementedError


def active_shard() -> Optional[TokenShard]:
    """The shard of the token-parallel call in progress; ``None`` outside one."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextmanager
def sharded(shard: Optional[TokenShard]) -> Iterator[None]:
    """Make ``shard`` the active one while the block runs (``None``: leave things as they are)."""
    if shard is None:
        yield
        return
    _ACTIVE.append(shard)
    try:
        yield
    finally:
        _ACTIVE.pop()


def recompute_in_same_shard():
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint``: the recomputation in the
    backward runs after the token-parallel call has returned, so it re-activates the shard the
    forward ran in (and with it the same collectives, in the same order on every rank)."""
    return nullcontext(), sharded(active_shard())
