"""The differentiable collectives of token parallelism: a sum over the group, the halo rows of
a convolution, and the gather of row stripes into whole maps.

The sum is ``torch.distributed._functional_collectives.all_reduce``: its autograd formula (sum
in torch 2.13, on gloo and nccl alike) all-reduces the gradient, and it traces under
``torch.compile``. Point-to-point sends have no autograd formula, so the halo exchange is an
``autograd.Function`` whose backward sends each halo row's gradient back to the rank that owns
the row, where it is added.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor


def world_of(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    return dist.group.WORLD if group is None else group


def all_reduce_sum(tensors: Sequence[Tensor], group: Optional[dist.ProcessGroup]) -> List[Tensor]:
    """Each tensor summed over ``group``, as one collective on their concatenation."""
    flat = funcol.all_reduce(torch.cat([t.reshape(-1) for t in tensors]), 'sum', world_of(group))
    return [part.view_as(t) for part, t in
            zip(flat.split([t.numel() for t in tensors]), tensors)]


def _exchange(up: Tensor, down: Tensor,
              group: dist.ProcessGroup) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Send ``up`` to the previous rank and ``down`` to the next; return what the previous rank
    sent down and what the next rank sent up (``None`` at the first and last rank)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ops, above, below = [], None, None
    if rank > 0:
        peer = dist.get_global_rank(group, rank - 1)
        above = torch.empty_like(down, memory_format=torch.contiguous_format)
        ops += [dist.P2POp(dist.isend, up.contiguous(), peer, group),
                dist.P2POp(dist.irecv, above, peer, group)]
    if rank < world - 1:
        peer = dist.get_global_rank(group, rank + 1)
        below = torch.empty_like(up, memory_format=torch.contiguous_format)
        ops += [dist.P2POp(dist.isend, down.contiguous(), peer, group),
                dist.P2POp(dist.irecv, below, peer, group)]
    for request in dist.batch_isend_irecv(ops) if ops else ():
        request.wait()
    return above, below


def _top_rows(x: Tensor, rows: int) -> Tensor:
    """The first ``rows`` rows; zero rows below a stripe shorter than that (only the last
    stripe can be: the image ends there)."""
    top = x[:, :, :rows]
    if top.shape[2] < rows:
        top = torch.cat([top, top.new_zeros(*top.shape[:2], rows - top.shape[2], top.shape[3])],
                        dim=2)
    return top


class _RowHalo(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, rows: int, group: dist.ProcessGroup) -> Tensor:
        ctx.rows, ctx.group, ctx.height = rows, group, x.shape[2]
        top = _top_rows(x, rows)
        above, below = _exchange(top, x[:, :, -rows:], group)
        zeros = top.new_zeros(top.shape)  # beyond the image: the conv's zero padding
        return torch.cat([zeros if above is None else above, x,
                          zeros if below is None else below], dim=2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows, height = ctx.rows, ctx.height
        d_x = grad[:, :, rows:rows + height].contiguous()
        # the halo rows' gradients go back to their owners, which receive those of their rows
        for_top, for_bottom = _exchange(grad[:, :, :rows], grad[:, :, rows + height:], ctx.group)
        if for_top is not None:
            kept = min(rows, height)
            d_x[:, :, :kept] += for_top[:, :, :kept]
        if for_bottom is not None:
            d_x[:, :, height - rows:] += for_bottom
        return d_x, None, None


def exchange_halo(x: Tensor, rows: int, group: Optional[dist.ProcessGroup]) -> Tensor:
    """``(B, C, h, W)`` -> ``(B, C, rows + h + rows, W)``: the previous rank's last ``rows``
    rows above, the next rank's first ``rows`` below, zeros at the image's edges."""
    return _RowHalo.apply(x, rows, world_of(group))


class _GatherRows(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        world = dist.get_world_size(group)
        heights = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(world)]
        dist.all_gather(heights, torch.tensor([x.shape[2]], device=x.device), group)
        heights = [int(h) for h in heights]
        padded = x.new_zeros(*x.shape[:2], max(heights), x.shape[3])
        padded[:, :, :x.shape[2]] = x
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded, group)
        ctx.group, ctx.heights, ctx.rank = group, heights, dist.get_rank(group)
        return torch.cat([part[:, :, :h] for part, h in zip(parts, heights)], dim=2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous()  # a fresh tensor the in-place collective may write
        dist.all_reduce(grad, group=ctx.group)
        start = sum(ctx.heights[:ctx.rank])
        return grad[:, :, start:start + ctx.heights[ctx.rank]], None


def gather_rows(x: Tensor, group: Optional[dist.ProcessGroup]) -> Tensor:
    """Every rank's row stripe ``(B, C, h_r, W)``, in rank order, as one map on every rank.
    Backward: each rank's stripe gets the sum over the ranks of the gradients of its rows."""
    return _GatherRows.apply(x, world_of(group))
