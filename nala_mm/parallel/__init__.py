"""Token parallelism: one image's rows across the ranks of a process group
(docs/user_guides/token_parallel.md). Loaded on use, not by ``import nala_mm``."""
from .segmentor import ShardedSegmentor
from .token_parallel import TokenParallel

__all__ = ['ShardedSegmentor', 'TokenParallel']
