"""A hook that writes, at the end of training, a checksum of every parameter, buffer and
optimizer-state tensor of its rank to ``<work_dir>/state_rank<rank>.json``: the multi-process
tests compare the ranks. Imported by those tests' configs (``custom_imports``)."""
import json
import os.path as osp

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


def _checksum(tensor: torch.Tensor) -> list:
    values = tensor.detach().double().flatten()
    return [float(values.sum()), float(values.abs().sum()), float(values.square().sum())]


@HOOKS.register_module()
class StateProbeHook(Hook):
    priority = 'LOWEST'

    def after_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        names = {id(p): name for name, p in model.named_parameters()}
        optimizer = {}
        for param, state in runner.optim_wrapper.optimizer.state.items():
            for key, value in state.items():
                if torch.is_tensor(value):
                    optimizer[f'{names[id(param)]}:{key}'] = _checksum(value)
        record = dict(
            params={name: _checksum(p) for name, p in model.named_parameters()},
            buffers={name: _checksum(b) for name, b in model.named_buffers()
                     if b.is_floating_point()},
            optimizer=optimizer)
        with open(osp.join(runner.work_dir, f'state_rank{runner.rank}.json'), 'w') as f:
            json.dump(record, f)
