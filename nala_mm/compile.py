"""torch.compile in training and inference: the tools' compiled feature extraction, eager updates.

Inference: mmengine's ``compile=True`` compiles ``train_step`` only; testing stays eager.
``tools/test.py``, ``tools/infer.py`` and ``tools/benchmark.py`` take ``--compile`` and call
:func:`compile_feature_extraction` on the built model: ``extract_feat`` (backbone and neck, the
part that holds the attention) is compiled; the heads and the post-processing stay eager.

Sizes: inference meets many image sizes (keep-ratio resizes, slide windows, padded batches),
and the backbones are size-agnostic, so the sizes are compiled dynamic (``dynamic=True``): one
graph serves every size its guards admit. Dynamo still specialises a few facts (a square input,
a conv's choice of algorithm by size), so a size sequence compiles a handful of graphs
(``docs/speed.md`` gives the counts). Torch's default, once a function has recompiled
``recompile_limit`` times, is to run it eager *silently*; here the limit is
:data:`RECOMPILE_LIMIT` and hitting it raises an error that names the size and the limit, so a
compiled run is compiled throughout or stops. :attr:`CompiledFeatureExtraction.compilations`
counts the graphs compiled so far.

Training: mmengine's ``compile=True`` compiles the whole ``train_step``, the optimizer's update
included. Traced, ``optimizer.step`` fails on mmengine's param groups (``ConfigDict`` objects, which
dynamo does not take for dicts) and, where it did not, would recompile whenever the scheduler
changes the learning rate (a Python float dynamo specialises on). :func:`eager_optimizer_updates`
(installed by :mod:`nala_mm.compat`) runs ``OptimWrapper.update_params`` outside the graph: the
forward and the loss are compiled, their backward is AOTAutograd's compiled backward, and the
update runs eager as it does without compilation.
"""
from typing import Callable, Optional

import torch
from mmengine.optim import OptimWrapper
from torch import nn

# compilations a compiled feature extraction may make (the first and its recompilations)
RECOMPILE_LIMIT = 8


def feature_extractor(model: nn.Module) -> nn.Module:
    """The segmentor or detector inside ``model``: through DDP wrappers and TTA models (both
    hold it as ``.module``), the first module with an ``extract_feat``."""
    inner = model
    while not hasattr(inner, 'extract_feat') and isinstance(getattr(inner, 'module', None),
                                                             nn.Module):
        inner = inner.module
    if not hasattr(inner, 'extract_feat'):
        raise TypeError(f'{type(model).__name__} has no extract_feat (nor a wrapped .module '
                        'with one): expected an mmseg segmentor or an mmdet detector')
    return inner


class CompiledFeatureExtraction:
    """``extract_feat`` compiled, called with the recompile limit in force.

    Args:
        extract_feat: the bound method to compile.
        backend, mode, dynamic, fullgraph: as ``torch.compile``'s.
        recompile_limit: compilations allowed before an error (none silently run eager).
    """

    def __init__(self, extract_feat: Callable, backend: str = 'inductor',
                 mode: Optional[str] = None, dynamic: Optional[bool] = True,
                 fullgraph: bool = False, recompile_limit: int = RECOMPILE_LIMIT):
        if recompile_limit < 1:
            raise ValueError(f'recompile_limit must be at least 1, got {recompile_limit}')
        self.eager = extract_feat
        self.recompile_limit = recompile_limit
        self.compilations = 0
        self._backend = torch._dynamo.lookup_backend(backend)
        self._compiled = torch.compile(extract_feat, backend=self._count_and_compile, mode=mode,
                                       dynamic=dynamic, fullgraph=fullgraph)

    def _count_and_compile(self, graph: torch.fx.GraphModule, example_inputs):
        self.compilations += 1
        return self._backend(graph, example_inputs)

    def __call__(self, inputs: torch.Tensor):
        # read by dynamo when it meets a frame, i.e. during the call
        with torch._dynamo.config.patch(recompile_limit=self.recompile_limit,
                                        fail_on_recompile_limit_hit=True):
            try:
                return self._compiled(inputs)
            except torch._dynamo.exc.FailOnRecompileLimitHit as error:
                raise RuntimeError(
                    f'compiled feature extraction: input of size {tuple(inputs.shape)} needs a '
                    f'new graph after {self.compilations} compilations, and recompile_limit is '
                    f'{self.recompile_limit} (expected at most that many distinct size classes; '
                    'raise recompile_limit, or run this size sequence eager)') from error


def compile_feature_extraction(model: nn.Module, backend: str = 'inductor',
                               mode: Optional[str] = None, dynamic: Optional[bool] = True,
                               fullgraph: bool = False,
                               recompile_limit: int = RECOMPILE_LIMIT) -> CompiledFeatureExtraction:
    """Replace ``extract_feat`` of the segmentor or detector in ``model`` by a compiled one, on
    the instance (the parameters, their names and the state dict are untouched: checkpoints
    stay interchangeable with eager ones). Returns the compiled callable (its
    ``compilations`` count the graphs made)."""
    inner = feature_extractor(model)
    if isinstance(inner.extract_feat, CompiledFeatureExtraction):
        raise RuntimeError(f'the feature extraction of {type(inner).__name__} is compiled already')
    compiled = CompiledFeatureExtraction(inner.extract_feat, backend, mode, dynamic, fullgraph,
                                         recompile_limit)
    inner.extract_feat = compiled
    return compiled


def eager_optimizer_updates() -> None:
    """Make ``OptimWrapper.update_params`` (backward, step, zero_grad; every mmengine optimizer
    wrapper inherits it) run outside any ``torch.compile`` graph. Idempotent."""
    if not getattr(OptimWrapper.update_params, 'nala_eager', False):
        update_params = torch._dynamo.disable(OptimWrapper.update_params)
        update_params.nala_eager = True
        OptimWrapper.update_params = update_params
