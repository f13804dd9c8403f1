"""Under mmengine's whole-``train_step`` compile, the optimizer update runs eager.

Why: mmengine (0.10.7) with ``compile=True`` compiles the model's ``train_step``, and with it
``optim_wrapper.update_params`` (backward, step, zero_grad). Traced, ``optimizer.step`` fails on
mmengine's param groups (``ConfigDict`` objects, which dynamo does not take for dicts) and, where
it did not, would recompile whenever the scheduler changes the learning rate (a Python float
dynamo specialises on). ``tools/train.py --compile`` therefore builds the run's optimizer
wrapper before ``runner.train()`` (which keeps a built one) and puts a
``torch._dynamo.disable``-wrapped ``update_params`` on that *instance*: the forward and the loss
are compiled, their backward is AOTAutograd's compiled backward, the update runs eager. The
class ``OptimWrapper`` is untouched. Needed with torch 2.4 to 2.13 and mmengine 0.10.7.
"""
import torch
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.runner import Runner


def eager_update_params(wrapper: OptimWrapper) -> None:
    """Make ``wrapper.update_params`` (of each wrapper of an ``OptimWrapperDict``) run outside
    any ``torch.compile`` graph; on the instance only."""
    for each in wrapper.values() if isinstance(wrapper, OptimWrapperDict) else (wrapper,):
        each.update_params = torch._dynamo.disable(each.update_params)


def eager_optimizer_updates(runner: Runner) -> None:
    """Build ``runner``'s optimizer wrapper now (``runner.train()`` keeps a built one), with
    eager updates (:func:`eager_update_params`)."""
    runner.optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    eager_update_params(runner.optim_wrapper)
