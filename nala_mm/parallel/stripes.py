"""How an image's rows split across ranks: contiguous blocks in rank order."""
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class Stripes:
    """Row ``bounds[r] = (start, stop)`` of the image for rank ``r``, of ``image_rows`` rows
    cut into blocks of ``block`` rows (the last block may be short)."""
    image_rows: int
    block: int
    bounds: Tuple[Tuple[int, int], ...]


def split_rows(image_rows: int, ranks: int, block: int, min_blocks: int) -> Stripes:
    """Blocks of ``block`` rows dealt out as evenly as they go (the first ranks take one more
    when they do not divide); every rank needs ``min_blocks`` of them so that the halo rows of
    the coarsest resolution come from its direct neighbours."""
    if image_rows < 1 or ranks < 1:
        raise ValueError(f'cannot split an image of {image_rows} rows across {ranks} ranks')
    blocks = -(-image_rows // block)
    if ranks > blocks:
        raise ValueError(f'more ranks ({ranks}) than row blocks ({blocks}): an image of '
                         f'{image_rows} rows is {blocks} blocks of {block} rows, and each rank '
                         f'holds at least {min_blocks} of them')
    if blocks < ranks * min_blocks:
        raise ValueError(f'an image of {image_rows} rows is too small to split across {ranks} '
                         f'ranks: it is {blocks} blocks of {block} rows, and each rank needs '
                         f'{min_blocks} ({ranks * min_blocks} blocks, '
                         f'{ranks * min_blocks * block} image rows at least)')
    base, extra = divmod(blocks, ranks)
    bounds, start = [], 0
    for rank in range(ranks):
        stop = min(start + (base + (rank < extra)) * block, image_rows)
        bounds.append((start, stop))
        start = stop
    return Stripes(image_rows, block, tuple(bounds))
