"""Under mmengine's whole-``train_step`` compile, the optimizer update runs eager.

Why: mmengine (0.10.7) with ``compile=True`` compiles the model's ``train_step``, and with it
``optim_wrapper.update_params`` (backward, step, zero_grad). Traced, ``optimizer.step`` fails on
mmengine's param groups (``ConfigDict`` objects, which dynamo does not take for dicts) and, where
it did not, would recompile whenever the scheduler changes the learning rate (a Python float
dynamo specialises on). :class:`EagerOptimizerUpdatesHook` therefore puts a
``torch._dynamo.disable``-wrapped ``update_params`` on the run's optimizer wrapper *instance*
before the first step: the forward and the loss are compiled, their backward is AOTAutograd's
compiled backward, the update runs eager. The class ``OptimWrapper`` is untouched.
``tools/train.py --compile`` adds the hook; under mmseg's or mmdet's own ``train.py`` a config
with ``compile = True`` names it in ``custom_hooks`` (docs/reports/speed.md). Needed with torch
2.4 to 2.13 and mmengine 0.10.7 (dynamo fails on ``ConfigDict`` param groups with
``'UserDefinedDictVariable' object has no attribute 'items'``).
"""
import torch
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapper, OptimWrapperDict

from ..registry import register_hook


def eager_update_params(wrapper: OptimWrapper) -> None:
    """Make ``wrapper.update_params`` (of each wrapper of an ``OptimWrapperDict``) run outside
    any ``torch.compile`` graph; on the instance only."""
    for each in wrapper.values() if isinstance(wrapper, OptimWrapperDict) else (wrapper,):
        each.update_params = torch._dynamo.disable(each.update_params)


@register_hook
class EagerOptimizerUpdatesHook(Hook):
    """Before training (the Runner has built the optimizer wrapper, and the compiled
    ``train_step`` has not run yet), the wrapper's updates run eager
    (:func:`eager_update_params`)."""

    def before_train(self, runner) -> None:
        eager_update_params(runner.optim_wrapper)
