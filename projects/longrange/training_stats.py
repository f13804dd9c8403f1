"""What a token mixer does while it trains, logged beside the loss: ``MixerStatsHook``.

Every ``interval`` iterations, for each named mixer (a :class:`~nala_mm.models.GatedAttention`
of the model), from that iteration's own forward and backward:

* ``grad_norm``: the L2 norm of the gradient that reached the mixer's parameters;
* ``qnorm``: the mean query norm;
* ``exponent`` and ``saturated``: NaLa's mean query-norm exponent and the share of queries
  whose exponent is within 1 % of its ceiling (norm-aware mixers only);
* ``negative``: the share of negative weights in the attention rows of up to ``rows`` queries,
  RoPE on, as the mixer applies them (what a signed feature map such as the cosine-inhibit one
  produces; 0 for softmax).

Scalars go to mmengine's message hub as ``train/mixer/<name>/<stat>``, so the LoggerHook prints
them and ``scalars.json`` keeps them. Registered in mmengine's root ``HOOKS`` when this module
imports; a config (run from the repository root, with it on ``PYTHONPATH``)::

    custom_imports = dict(imports=['nala_mm', 'projects.longrange.training_stats'],
                          allow_failed_imports=False)

    custom_hooks = [dict(type='MixerStatsHook', layers=['backbone.layers.0.blocks.0.attn'],
                         interval=25)]
"""
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.hooks import Hook
from torch import nn

from nala_mm.analysis.attention_stats import SATURATION
from nala_mm.models import GatedAttention
from nala_mm.registry import register_hook

ROW_SEED = 0  # which query rows the negative share samples


@register_hook
class MixerStatsHook(Hook):
    """Log gradient, query-norm, exponent and sign statistics of named token mixers while
    training (see the module docstring). ``layers``: module names within the model (the
    runner's model, wrappers unwrapped), e.g. ``'backbone.layers.0.blocks.0.attn'``."""

    priority = 'NORMAL'

    def __init__(self, layers: Sequence[str], interval: int = 50, rows: int = 256):
        if not layers:
            raise ValueError('MixerStatsHook needs the names of the mixers to watch, e.g. '
                             "layers=['backbone.layers.0.blocks.0.attn']")
        if interval < 1 or rows < 1:
            raise ValueError(f'interval and rows must be >= 1, got interval={interval!r}, '
                             f'rows={rows!r}')
        self.names, self.interval, self.rows = list(layers), int(interval), int(rows)
        self._inputs: Dict[str, tuple] = {}
        self._grad_sq: Dict[str, float] = {}
        self._watching = False
        self._handles: List[torch.utils.hooks.RemovableHandle] = []

    # -------------------------------------------------------------------- attaching to a model
    def attach(self, model: nn.Module) -> None:
        """Hook the named mixers of ``model``: their inputs (while watching) and the gradient
        accumulated into their parameters."""
        modules = dict(model.named_modules())
        missing = [n for n in self.names if not isinstance(modules.get(n), GatedAttention)]
        if missing:
            mixers = [n for n, m in modules.items() if isinstance(m, GatedAttention)]
            raise ValueError(f'MixerStatsHook: {missing} are not token mixers of the model; '
                             f'its mixers are {mixers[:8]}{" ..." if len(mixers) > 8 else ""}')
        for name in self.names:
            layer = modules[name]
            self._handles.append(layer.register_forward_hook(self._keep_input(name),
                                                             with_kwargs=True))
            for param in layer.parameters():
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(
                        self._add_grad(name)))
        self.layers = {name: modules[name] for name in self.names}

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _keep_input(self, name: str):
        def hook(module, args, kwargs, output):
            if self._watching:
                call = dict(zip(('x', 'hw_shape', 'num_prefix'), args), **kwargs)
                hw_shape = call.get('hw_shape')
                self._inputs[name] = (call['x'][:1].detach(),
                                      None if hw_shape is None else tuple(hw_shape),
                                      call.get('num_prefix', 0))
        return hook

    def _add_grad(self, name: str):
        def hook(param):
            if self._watching and param.grad is not None:
                self._grad_sq[name] = self._grad_sq.get(name, 0.0) + \
                    float(param.grad.detach().float().square().sum())
        return hook

    # -------------------------------------------------------------------- one watched iteration
    def watch(self) -> None:
        """Record the next forward's inputs and backward's gradients."""
        self._inputs.clear()
        self._grad_sq.clear()
        self._watching = True

    def collect(self) -> Dict[str, Dict[str, Optional[float]]]:
        """The statistics of the watched iteration, by mixer name; stops watching."""
        self._watching = False
        found = {}
        for name, layer in self.layers.items():
            if name not in self._inputs:
                continue
            stats = mixer_statistics(layer, *self._inputs[name], rows=self.rows)
            stats['grad_norm'] = self._grad_sq[name] ** 0.5 if name in self._grad_sq else None
            found[name] = stats
        self._inputs.clear()
        self._grad_sq.clear()
        return found

    # -------------------------------------------------------------------- the runner's calls
    def before_train(self, runner) -> None:
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        self.attach(model)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self.every_n_train_iters(runner, self.interval):
            self.watch()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not self._watching:
            return
        for name, stats in self.collect().items():
            for key, value in stats.items():
                if value is not None:
                    runner.message_hub.update_scalar(f'train/mixer/{name}/{key}', value)

    def after_train(self, runner) -> None:
        self.detach()


def mixer_statistics(layer: GatedAttention, x: torch.Tensor, hw_shape=None, num_prefix: int = 0,
                     rows: int = 256) -> Dict[str, Optional[float]]:
    """Query norm, exponent, saturation and negative-weight share of ``layer`` on its input
    ``x`` (one sample, as its forward took it)."""
    with torch.no_grad():
        q, k, _, _, rope = layer.project(x.float(), hw_shape, num_prefix)
        qnorm = torch.linalg.vector_norm(q[0], dim=-1)
        tokens = q.shape[-2]
        generator = torch.Generator().manual_seed(ROW_SEED)
        chosen = torch.randperm(tokens, generator=generator)[:rows].sort().values.to(q.device)
        weights = layer.attention_weights(q, k, rope, chosen)
        power = layer.query_exponent(qnorm.double())
        ceiling = layer.exponent_ceiling()
    return dict(qnorm=float(qnorm.mean()), negative=float((weights < 0).double().mean()),
                exponent=None if power is None else float(power.mean()),
                saturated=None if power is None or ceiling is None
                else float((power >= SATURATION * ceiling).double().mean()))


def series_mean(records: Sequence[dict], key: str, until: Optional[int] = None,
                last: Optional[int] = None) -> Optional[float]:
    """Mean of ``key`` over logged records (dicts with ``'iter'``, as a run's ``scalars.json``
    gives them) that hold it: those at iterations up to ``until``, or the ``last`` ones; all of
    them with neither. ``None`` when no record holds it."""
    if until is not None and last is not None:
        raise ValueError(f'give until ({until}) or last ({last}), not both')
    values = [r[key] for r in records if r.get(key) is not None
              and (until is None or r['iter'] <= until)]
    values = values[-last:] if last else values
    return sum(values) / len(values) if values else None
