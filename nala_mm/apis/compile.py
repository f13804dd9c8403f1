"""torch.compile in training and inference: the settings compiled calls need, whole-model and
regional compilation, compiled feature extraction, eager optimizer updates.

**Settings** (:func:`compile_settings`, read by dynamo and AOTAutograd while a call compiles):

* ``fail_on_recompile_limit_hit=True``: torch's default, once a function has recompiled
  ``recompile_limit`` times, is to run it eager *silently*; here hitting the limit raises.
* ``torch._functorch.config.recompute_views=True``: AOTAutograd recomputes view ops in the
  backward instead of saving views. Works around an inductor bug (torch 2.11 to 2.14.1): a saved
  activation that is a view (the channels-last view a depthwise conv reads, the head split of
  the attention) is a forward-graph output, and ``GraphLowering.run_node`` orders its strides
  with ``ir.get_stride_order(strides)`` without the shape env. With dynamic sizes the strides are
  expressions of ``(H - 1) // 4`` and the like, sympy cannot order them, and the compile fails
  with ``TypeError: cannot determine truth value of Relational``, at the second input size of a
  training run (the first dynamic compile). Views are metadata: recomputing them costs nothing.

The project's entry points apply them around every compiled call; a plain ``torch.compile``
of a model that trains at changing sizes needs them too: call it inside ``with
compile_settings():`` (a tool whose compiled calls mmengine makes applies them for the process:
:func:`apply_compile_settings`).

**Whole model** (:func:`compile_model`) and **regional** (:func:`compile_regions`): the latter
compiles the *class* of each repeated block once (NaLaFormer's :class:`NaLaBlock`, the stock
blocks of the swapped Swin, MiT, PVTv2 and ViT) and lets every instance share its graphs, which
cuts compile time (``docs/reports/speed.md``); the stem, downsamples and heads stay eager.

**Inference** (:func:`compile_feature_extraction`): mmengine's ``compile=True`` compiles
``train_step`` only; ``tools/test.py``, ``tools/infer.py`` and ``tools/benchmark.py`` take
``--compile`` and compile ``extract_feat`` (backbone and neck) with dynamic sizes: one graph
serves every size its guards admit, and a size sequence compiles a handful of graphs
(``docs/reports/speed.md`` gives the counts).

**Training under mmengine** (``tools/train.py --compile``): mmengine compiles the whole
``train_step``, the optimizer's update included. Traced, ``optimizer.step`` fails on mmengine's
param groups (``ConfigDict`` objects, which dynamo does not take for dicts) and, where it did
not, would recompile whenever the scheduler changes the learning rate (a Python float dynamo
specialises on). The tool runs the update of the run's optimizer wrapper outside the graph
(:mod:`nala_mm.compat.eager_updates`): the forward and the loss are compiled, their backward is
AOTAutograd's compiled backward, and the update runs eager.
"""
import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch._dynamo.config
import torch._functorch.config
from torch import nn

# compilations a compiled function may make (the first and its recompilations)
RECOMPILE_LIMIT = 8


def _settings(recompile_limit: int) -> List[Tuple[object, dict]]:
    """The settings of the module docstring: (torch config module, values) pairs."""
    if recompile_limit < 1:
        raise ValueError(f'recompile_limit must be at least 1, got {recompile_limit}')
    return [(torch._dynamo.config, dict(recompile_limit=recompile_limit,
                                        fail_on_recompile_limit_hit=True)),
            (torch._functorch.config, dict(recompute_views=True))]


@contextlib.contextmanager
def compile_settings(recompile_limit: int = RECOMPILE_LIMIT) -> Iterator[None]:
    """The settings of the module docstring, for the calls made inside."""
    with contextlib.ExitStack() as stack:
        for config, values in _settings(recompile_limit):
            stack.enter_context(config.patch(**values))
        yield


def apply_compile_settings(recompile_limit: int = RECOMPILE_LIMIT) -> None:
    """:func:`compile_settings` for the rest of the process: for a tool whose compiled calls
    another library makes (mmengine's compiled ``train_step``)."""
    for config, values in _settings(recompile_limit):
        for name, value in values.items():
            setattr(config, name, value)


class CompiledCall:
    """A function compiled with ``torch.compile``, called under :func:`compile_settings`.

    ``compilations`` counts the compiler's calls: one per graph, and one more for an analysis
    dynamo restarts (``dynamic=True`` restarts its first once where it meets Python floats).

    Args:
        fn: what to compile (a module, a bound method, a function).
        backend, mode, dynamic, fullgraph: as ``torch.compile``'s.
        recompile_limit: compilations allowed before an error (none silently run eager).
    """

    def __init__(self, fn: Callable, backend: str = 'inductor', mode: Optional[str] = None,
                 dynamic: Optional[bool] = None, fullgraph: bool = False,
                 recompile_limit: int = RECOMPILE_LIMIT):
        _settings(recompile_limit)  # validates
        self.eager = fn
        self.recompile_limit = recompile_limit
        self.compilations = 0
        self._backend = torch._dynamo.lookup_backend(backend)
        self._compiled = torch.compile(fn, backend=self._count_and_compile, mode=mode,
                                       dynamic=dynamic, fullgraph=fullgraph)

    def _count_and_compile(self, graph: torch.fx.GraphModule, example_inputs):
        self.compilations += 1
        return self._backend(graph, example_inputs)

    def __call__(self, *args, **kwargs):
        with compile_settings(self.recompile_limit):
            try:
                return self._compiled(*args, **kwargs)
            except torch._dynamo.exc.FailOnRecompileLimitHit as error:
                sizes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
                raise RuntimeError(
                    f'compiled call: input of size {sizes} needs a new graph after '
                    f'{self.compilations} compilations, and recompile_limit is '
                    f'{self.recompile_limit} (expected at most that many distinct size '
                    'classes; raise recompile_limit, or run this size sequence eager)') from error


def compile_model(model: nn.Module, backend: str = 'inductor', mode: Optional[str] = None,
                  dynamic: Optional[bool] = None, fullgraph: bool = False,
                  recompile_limit: int = RECOMPILE_LIMIT) -> CompiledCall:
    """``model`` compiled whole, for training or inference at changing sizes: the returned
    callable runs it (its parameters are the model's; the model itself stays eager)."""
    return CompiledCall(model, backend, mode, dynamic, fullgraph, recompile_limit)


def _region_classes() -> Tuple[type, ...]:
    """The repeated blocks of the backbones the package builds or swaps (the stock classes of
    the mmdet families only where mmdet imports)."""
    from mmseg.models.backbones.mit import TransformerEncoderLayer as MiTLayer
    from mmseg.models.backbones.swin import SwinBlock as SegSwinBlock
    from mmseg.models.backbones.vit import TransformerEncoderLayer as ViTLayer

    from ..models.nalaformer import NaLaBlock
    classes = [NaLaBlock, SegSwinBlock, MiTLayer, ViTLayer]
    try:
        from mmdet.models.backbones.pvt import PVTEncoderLayer
        from mmdet.models.backbones.swin import SwinBlock as DetSwinBlock
        classes += [DetSwinBlock, PVTEncoderLayer]
    except ImportError:
        pass
    return tuple(classes)


def region_modules(model: nn.Module) -> List[nn.Module]:
    """The repeated blocks inside ``model`` (outermost first; a block's own sub-blocks are not
    counted again)."""
    classes, found = _region_classes(), []
    for module in model.modules():
        if isinstance(module, classes) and not any(module in set(f.modules()) for f in found):
            found.append(module)
    return found


class CompiledRegions:
    """What :func:`compile_regions` compiled: per block class, one compiled forward shared by
    its instances. ``compilations`` counts the graphs made so far, over every class."""

    def __init__(self, compiled: Dict[type, CompiledCall], blocks: int):
        self.compiled, self.blocks = compiled, blocks

    @property
    def compilations(self) -> int:
        return sum(c.compilations for c in self.compiled.values())

    def __repr__(self) -> str:
        names = ', '.join(cls.__name__ for cls in self.compiled)
        return f'CompiledRegions({self.blocks} blocks of {names})'


def compile_regions(model: nn.Module, backend: str = 'inductor', mode: Optional[str] = None,
                    dynamic: Optional[bool] = None,
                    recompile_limit: int = RECOMPILE_LIMIT) -> CompiledRegions:
    """Compile the repeated blocks of ``model`` in place, one compiled forward per block class.

    Every instance calls its class's compiled ``forward`` with itself as the first argument, so
    blocks of one shape share a graph (dynamo lifts their parameters to inputs). Blocks of
    different shapes (a hierarchical backbone's stages) make a graph each, and so does each
    size class of the input: ``recompile_limit`` is per block class *and* distinct block
    configuration, scaled here by the number of distinct (class, parameter shapes) pairs.
    Parameters, names and the state dict are untouched; the rest of the model runs eager.
    """
    blocks = region_modules(model)
    if not blocks:
        raise TypeError(f'{type(model).__name__} holds none of the repeated blocks regional '
                        f'compilation knows: {[c.__name__ for c in _region_classes()]}')
    configurations: Dict[type, set] = {}
    for block in blocks:
        configurations.setdefault(type(block), set()).add(
            tuple((name, tuple(p.shape)) for name, p in block.named_parameters()))
    compiled = {cls: CompiledCall(cls.forward, backend, mode, dynamic,
                                  recompile_limit=recompile_limit * len(shapes))
                for cls, shapes in configurations.items()}
    for block in blocks:
        if 'forward' in vars(block):
            raise RuntimeError(f'{type(block).__name__} at {id(block):#x} is compiled already '
                               '(its forward is set on the instance)')
        block.forward = _BoundRegion(compiled[type(block)], block)
    return CompiledRegions(compiled, len(blocks))


class _BoundRegion:
    """A block's compiled forward: the class's compiled function with the block as ``self``
    (a plain object, not a ``functools.partial``, so that ``vars(block)`` shows it)."""

    def __init__(self, compiled: CompiledCall, block: nn.Module):
        self.compiled, self.block = compiled, block

    def __call__(self, *args, **kwargs):
        return self.compiled(self.block, *args, **kwargs)


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


def compile_feature_extraction(model: nn.Module, backend: str = 'inductor',
                               mode: Optional[str] = None, dynamic: Optional[bool] = True,
                               fullgraph: bool = False,
                               recompile_limit: int = RECOMPILE_LIMIT) -> CompiledCall:
    """Replace ``extract_feat`` of the segmentor or detector in ``model`` by a compiled one, on
    the instance (the parameters, their names and the state dict are untouched: checkpoints
    stay interchangeable with eager ones). Returns the compiled callable (its
    ``compilations`` count the graphs made)."""
    inner = feature_extractor(model)
    if isinstance(inner.extract_feat, CompiledCall):
        raise RuntimeError(f'the feature extraction of {type(inner).__name__} is compiled already')
    compiled = CompiledCall(inner.extract_feat, backend, mode, dynamic, fullgraph,
                            recompile_limit)
    inner.extract_feat = compiled
    return compiled

