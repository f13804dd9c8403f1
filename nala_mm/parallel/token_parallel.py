"""One image across the ranks of a process group: exact global NaLa with the rows split.

Per head, NaLa's global attention needs two sums over the tokens (the state and the key sum,
:mod:`nala_mm.ops.attention.global_keys`), so each mixer all-reduces them once; the
convolutions exchange halo rows with the neighbouring ranks; BatchNorm reduces its statistics
over the group (:mod:`.batch_norm`); everything else is token-local. The ops and models learn
of the split through the shard this wrapper activates for the duration of a call
(:mod:`nala_mm.ops.token_shard`), and run their single-process path otherwise.
"""
import math
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..models.mixers import KernelizedMixer
from ..models.nalaformer import NaLaFormer
from ..models.swap.vit import GlobalTokenAttention, NaLaVisionTransformer
from ..ops.token_shard import TokenShard, sharded
from .batch_norm import share_batch_statistics
from .collectives import all_reduce_sum, exchange_halo, gather_rows, world_of
from .stripes import Stripes, split_rows

# NaLaFormer: the stem's stride 4 and three stride-2 downsamples; a stripe starts at a multiple
# of the coarsest stride, so that every stage's rows split where the input's do
NALAFORMER_STRIDES = (4, 8, 16, 32)


class RowShard(TokenShard):
    """This rank's rows ``[start, stop)`` of an image of ``image_rows`` rows; ``strides``: the
    input rows per token row of each module that asks :meth:`grid_rows`."""

    def __init__(self, group: dist.ProcessGroup, start: int, image_rows: int,
                 strides: Dict[nn.Module, int]):
        self.group, self.start, self.image_rows, self.strides = group, start, image_rows, strides

    def reduce_sum(self, tensors: Sequence[Tensor]) -> List[Tensor]:
        return all_reduce_sum(tensors, self.group)

    def halo(self, x: Tensor, rows: int) -> Tensor:
        return exchange_halo(x, rows, self.group)

    def grid_rows(self, module: nn.Module) -> Tuple[int, int]:
        stride = self.strides[module]
        # the stem's and the downsamples' padded 3x3/s2 convs and the ViT's corner-padded
        # patches both make ceil(rows / stride) rows
        return self.start // stride, -(-self.image_rows // stride)

    @property
    def holds_prefix_keys(self) -> bool:
        return dist.get_rank(self.group) == 0


def _layout(module: nn.Module) -> Tuple[int, int, Dict[nn.Module, int]]:
    """``(block, min_blocks, strides)`` of a backbone: the rows a stripe starts at a multiple
    of, the blocks each rank needs, and each row-aware module's stride. Refuses a module with a
    mixer that is not kernelised, naming the first such stage or layer."""
    strides: Dict[nn.Module, int] = {}
    if isinstance(module, NaLaFormer):
        for i, (stage, stride) in enumerate(zip(module.layers, NALAFORMER_STRIDES)):
            for block in stage.blocks:
                if not isinstance(block.attn, KernelizedMixer):
                    raise ValueError(
                        f'TokenParallel needs kernelised token mixers (NaLa or linear) '
                        f'throughout; stage {i + 1} has {type(block.attn).__name__} (mixers '
                        f'entry {module.mixers[i]!r})')
                strides[block.attn] = stride
        block_rows = NALAFORMER_STRIDES[-1]
    elif isinstance(module, NaLaVisionTransformer):
        for i, layer in enumerate(module.layers):
            attn = layer.attn
            if not (isinstance(attn, GlobalTokenAttention)
                    and isinstance(attn.mixer, KernelizedMixer)):
                mixer = attn.mixer if isinstance(attn, GlobalTokenAttention) else attn
                raise ValueError(
                    f'TokenParallel needs kernelised token mixers (NaLa or linear) throughout; '
                    f'layer {i} has {type(mixer).__name__} (mixers entry '
                    f'{module.mixers[i]!r})')
            if getattr(layer, 'with_cp', False):
                raise ValueError(
                    "TokenParallel cannot run mmseg's ViT layer checkpointing (with_cp): its "
                    'recomputation runs outside the token-parallel call, without the halo and '
                    'all-reduce steps; build the backbone with with_cp=False')
            strides[attn.mixer] = module.patch_size
        strides[module.patch_embed] = module.patch_size
        block_rows = module.patch_size
    else:
        raise TypeError(f'TokenParallel wraps a NaLaFormer or a NaLaVisionTransformer, got '
                        f'{type(module).__name__}')
    # LePE's halo at the coarsest resolution must come from the direct neighbours
    min_blocks = max(math.ceil(mixer.lepe.padding[0] * stride / block_rows)
                     for mixer, stride in strides.items() if isinstance(mixer, KernelizedMixer))
    return block_rows, max(min_blocks, 1), strides


class TokenParallel(nn.Module):
    """Run ``module`` (an all-kernelised ``NaLaFormer`` or ``NaLaVisionTransformer``) on one
    image whose rows are split across the ranks of ``process_group`` (default: the world).

    ``tp(x)`` takes the whole image batch ``(B, C, H, W)``, the same on every rank;
    ``tp(x, stripe=True, image_rows=H)`` only this rank's rows (:meth:`stripes` says which).
    Either returns the module's output structure with each map holding this rank's rows;
    :meth:`gather` assembles the whole maps. The module's BatchNorm layers are turned, in
    place, into ones that reduce their statistics over the group during a call
    (:mod:`.batch_norm`). Parameter gradients are not reduced here: summed over the group
    (DDP over the same group sums them) they are the one-process gradients of the sum of every
    rank's loss on its rows.
    """

    def __init__(self, module: nn.Module, process_group: Optional[dist.ProcessGroup] = None):
        super().__init__()
        self.block_rows, self.min_blocks, self._strides = _layout(module)
        self.module = share_batch_statistics(module)
        self.process_group = process_group

    def stripes(self, image_rows: int) -> Stripes:
        """Every rank's rows of an image of ``image_rows`` rows; a ``ValueError`` naming the
        sizes when it is too small for the group."""
        group = world_of(self.process_group)
        return split_rows(image_rows, dist.get_world_size(group), self.block_rows,
                          self.min_blocks)

    def forward(self, x: Tensor, stripe: bool = False, image_rows: Optional[int] = None):
        group = world_of(self.process_group)
        if stripe and image_rows is None:
            raise ValueError('stripe=True needs image_rows, the whole image height: the global '
                             'token count, the RoPE rows and the position embedding use it')
        image_rows = image_rows if stripe else x.shape[2]
        start, stop = self.stripes(image_rows).bounds[dist.get_rank(group)]
        if not stripe:
            x = x[:, :, start:stop]
        elif x.shape[2] != stop - start:
            raise ValueError(f'rank {dist.get_rank(group)} holds rows {start}..{stop - 1} of '
                             f'an image of {image_rows} rows ({stop - start} rows), got an '
                             f'input of {x.shape[2]} rows')
        shard = RowShard(group, start, image_rows, self._strides)
        with self._same_random_draws(x.device), sharded(shard):
            return self.module(x)

    @contextmanager
    def _same_random_draws(self, device: torch.device) -> Iterator[None]:
        """In train mode, one seed for the call on every rank: DropPath draws one keep mask per
        sample, and the ranks holding the sample's rows must draw it alike."""
        if not self.module.training:
            yield
            return
        group = world_of(self.process_group)
        seed = torch.randint(2 ** 62, (1,), device=device)
        dist.broadcast(seed, dist.get_global_rank(group, 0), group)
        devices = [device] if device.type == 'cuda' else []
        with torch.random.fork_rng(devices=devices, device_type=device.type):
            torch.manual_seed(int(seed))
            yield

    def gather(self, outputs):
        """The module's output structure with every map ``(B, C, h, W)`` whole on every rank
        (other tensors, a class token's output, pass as they are). Differentiable: each rank's
        rows get the sum over the ranks of the gathered maps' gradients."""
        if isinstance(outputs, Tensor):
            return gather_rows(outputs, self.process_group) if outputs.dim() == 4 else outputs
        return type(outputs)(self.gather(item) for item in outputs)
