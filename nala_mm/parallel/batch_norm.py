"""BatchNorm whose batch statistics cover the whole image while its rows are split across ranks.

In train mode a BatchNorm layer normalises with the mean and variance over the batch and every
pixel; with the rows on several ranks each rank holds a part of those sums. Torch's
``SyncBatchNorm`` (what the shipped configs select as ``SyncBN``) reduces over the ranks but
refuses CPU tensors, so gloo needs this one: the sums and the count go through the group's
differentiable all-reduce (the mean first, then the squared deviations from it, which is as
exact as one process's two-pass variance), and every rank updates its running statistics with
the same global values, so they stay equal across ranks. Outside a token-parallel call, or in
eval mode, the layer is the class it was.
"""
from typing import Dict

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..ops.token_shard import active_shard


class GroupStatisticsMixin:
    """Put before a ``_BatchNorm`` class: its forward with statistics over the shard's group."""

    def forward(self, x: Tensor) -> Tensor:
        shard = active_shard()
        batch_statistics = self.training or (self.running_mean is None
                                             and self.running_var is None)
        if shard is None or not batch_statistics:
            return super().forward(x)
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        total, count = shard.reduce_sum([x.sum(dims), x.new_tensor([x.numel() / x.shape[1]])])
        count = count.detach()
        mean = total / count
        centred = x - mean.view(shape)
        (squares,) = shard.reduce_sum([centred.square().sum(dims)])
        var = squares / count
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.training and self.track_running_stats:
            self._update_running(mean.detach(), var.detach(), count)
        return out

    def _update_running(self, mean: Tensor, var: Tensor, count: Tensor) -> None:
        """As ``F.batch_norm`` updates them: the unbiased variance, momentum or (``None``) the
        cumulative average."""
        self.num_batches_tracked.add_(1)
        factor = (1.0 / self.num_batches_tracked.item() if self.momentum is None
                  else self.momentum)
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(var * count / (count - 1).clamp(min=1),
                                              alpha=factor)


_GROUP_CLASSES: Dict[type, type] = {}


def group_statistics_class(cls: type) -> type:
    """``cls`` with :class:`GroupStatisticsMixin` first, made once per BatchNorm class (torch's,
    mmengine's ``SyncBatchNorm`` wrapper, a user's subclass: each keeps what it adds)."""
    if cls not in _GROUP_CLASSES:
        _GROUP_CLASSES[cls] = type(f'Group{cls.__name__}', (GroupStatisticsMixin, cls), {})
    return _GROUP_CLASSES[cls]


def share_batch_statistics(module: nn.Module) -> nn.Module:
    """Turn every BatchNorm layer of ``module`` into its group-statistics form, in place: the
    same object, parameters, buffers and state-dict keys, a subclass of its class (as
    ``SyncBatchNorm.convert_sync_batchnorm`` changes what a model normalises over)."""
    for layer in module.modules():
        if isinstance(layer, _BatchNorm) and not isinstance(layer, GroupStatisticsMixin):
            layer.__class__ = group_statistics_class(type(layer))
    return module

