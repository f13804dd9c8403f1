"""What every swapped stock backbone shares: per-unit ``mixers``, the swap itself, and the
carry-over of a stock checkpoint's attention weights into the mixers.

A family file (:mod:`.swin`, :mod:`.spatial_reduction`, :mod:`.vit`) subclasses
:class:`SwappedAttentionMixin` with where its blocks are, what replaces one block's attention
(a :class:`SwappedAttention` with the stock module's ``forward`` signature) and how its upstream
checkpoints are laid out, and registers ``<Family mixin>, <stock parent>`` subclasses. What the
attention transfer (:mod:`nala_mm.apis.linearize`) needs is public on the mixin: ``swapped_names``,
``stock_parent()``, ``upstream_state()`` and ``adapt_state()``. The carry-over is a pure
function over state dicts (:func:`carry_over`): the upstream
attention's fused q, k, v projection goes into the first ``3C`` rows of the mixer's ``qkvg``
(the same q | k | v row order), its output projection into ``out_proj`` (a mixer in the stock
layout, ViTDet's :class:`~nala_mm.models.WindowSoftmaxAttention`, takes both as they are, and a
checkpoint of such mixers reads as the upstream one); what has no counterpart
in a global mixer is dropped; the mixer's own parts (the gate rows ``qkvg[3C:]``, LePE, its
LayerNorm ``ln``) stay as the mixer initialised them. Every tensor is accounted for in a
:class:`CarryOverReport`.

A pretrained checkpoint loads exactly or refuses: after the carry-over and the family's
``adapt_state``, a tensor whose shape differs from the model's (a q/k/v or projection that does
not fit its mixer, or any other tensor) raises, naming it with both shapes, unless the backbone
was built with ``pretrained_mismatch='skip'``, which keeps such tensors as initialised and logs
each one (a deliberate partial load).
"""
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from mmengine.logging import MMLogger
from mmengine.runner.checkpoint import CheckpointLoader, load_state_dict
from torch import Tensor, nn

from ...ops import resolve_mode
from ..depthwise import TokenConv2d
from ..mixer_specs import DEFAULT_HYBRID, MixerEntry, resolve_mixers
from ..state_dicts import Shape, backbone_state_dict, describe_shapes, shape_mismatches

# what ``pretrained_mismatch`` does with a checkpoint tensor whose shape differs from the model's
PRETRAINED_MISMATCH = ('raise', 'skip')


@dataclass(frozen=True)
class AttentionLayout:
    """Names, relative to the upstream attention module, of the tensors that carry over."""
    qkv_weight: str
    qkv_bias: str
    proj_weight: str
    proj_bias: str


@dataclass
class CarryOverReport:
    """What happened to each swapped attention module, keyed by its name in the backbone."""
    carried: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)  # (source, target)
    dropped: Dict[str, List[str]] = field(default_factory=dict)             # source keys
    new: Dict[str, List[str]] = field(default_factory=dict)                 # target keys / rows
    already_swapped: List[str] = field(default_factory=list)  # the checkpoint had the mixer
    # checkpoint tensors not loaded for their shape -> (checkpoint's shape, model's): a q/k/v or
    # projection against the mixer rows it would fill, any other tensor against the model's
    mis_shaped: Dict[str, Tuple[Shape, Shape]] = field(default_factory=dict)

    def lines(self, unit_of: Mapping[str, int], unit: str = 'stage') -> List[str]:
        """One line per stage or layer (``unit_of``: attention module name -> its index),
        naming the tensors relative to each block's attention module (a unit's blocks agree)."""
        units: Dict[int, List[str]] = {}
        for name in unit_of:
            units.setdefault(unit_of[name], []).append(name)
        out = []
        for index, names in sorted(units.items()):
            def relative(entries, names=names):
                seen = {}
                for name in names:
                    for entry in entries(name):
                        seen[entry.replace(f'{name}.', '')] = None
                return list(seen)
            carried = relative(lambda n: [f'{s} -> {t}' for s, t in self.carried.get(n, [])])
            dropped = relative(lambda n: self.dropped.get(n, []))
            new = relative(lambda n: self.new.get(n, []))
            kept = [n for n in names if n in self.already_swapped]
            out.append(f'{unit} {index + 1}, {len(names)} block{"s" if len(names) > 1 else ""}, '
                       f'per block: carried {carried}; dropped {dropped}; new {new}'
                       + (f'; loaded as saved (a swapped checkpoint): {kept}' if kept else ''))
        return out


def carry_over(state_dict: Mapping[str, Tensor], model_state: Mapping[str, Tensor],
               swapped: Iterable[str], layout: AttentionLayout
               ) -> Tuple[Dict[str, Tensor], CarryOverReport]:
    """Map an upstream backbone state dict onto a backbone whose attention modules ``swapped``
    now hold a token mixer (a :class:`SwappedAttention`, the mixer in ``.mixer``).

    Args:
        state_dict: the upstream backbone's tensors, keys relative to the backbone.
        model_state: the swapped backbone's current ``state_dict()``; the mixer's gate rows and
            new parts are taken from it.
        swapped: names of the swapped attention modules (``'stages.0.blocks.1.attn'``).
        layout: where the upstream attention holds the tensors that carry over.

    Returns:
        A new state dict (other keys untouched) and the report. A checkpoint that already holds
        a block's mixer (one saved from a swapped model) passes through as saved. An upstream
        q/k/v or projection whose shape does not fit the mixer is not carried: it is taken out
        of the state dict and listed in ``report.mis_shaped`` (the caller refuses or skips it,
        :meth:`SwappedAttentionMixin.carry_over_checkpoint`).
    """
    state = dict(state_dict)
    report = CarryOverReport()
    for name in swapped:
        source, target = f'{name}.', f'{name}.mixer.'
        # a checkpoint of ViTDet's layout holds the stock tensors under a stock-layout mixer:
        # read them as the upstream module's, whichever mixer they now go to
        for src, dst in _stock_layout_pairs(layout):
            if target + dst in state and f'{target}qkvg.weight' not in state:
                state[source + src] = state.pop(target + dst)
        under_source = sorted(k for k in state if k.startswith(source)
                              and not k.startswith(target))
        stock_layout = f'{target}qkv.weight' in model_state  # ViTDet's window mixer
        if f'{target}qkvg.weight' in state:
            report.already_swapped.append(name)
        if stock_layout:
            carried, new = _carry_as_is(state, model_state, source, target, layout,
                                        report.mis_shaped), []
        else:
            carried, new = _carry_into_qkvg(state, model_state, source, target, layout,
                                            report.mis_shaped)
        if carried:
            mixer_keys = [k for k in model_state if k.startswith(target)]
            filled = {t.split('[')[0] for _, t in carried}
            new += sorted(k for k in mixer_keys if k not in filled and k not in state)
        report.carried[name] = carried
        report.dropped[name] = [k for k in under_source if k in state]
        for key in report.dropped[name]:
            del state[key]
        report.new[name] = new
    return state, report


def _stock_layout_pairs(layout: AttentionLayout) -> Tuple[Tuple[str, str], ...]:
    """(upstream name, name in a stock-layout mixer) of the four tensors that carry over."""
    return ((layout.qkv_weight, 'qkv.weight'), (layout.qkv_bias, 'qkv.bias'),
            (layout.proj_weight, 'proj.weight'), (layout.proj_bias, 'proj.bias'))


def _take(state: Dict[str, Tensor], key: str, expected: Shape,
          mis_shaped: Dict[str, Tuple[Shape, Shape]]) -> Optional[Tensor]:
    """``state[key]``, taken out of ``state``, when it has the ``expected`` shape; ``None`` when
    it is absent or, recorded in ``mis_shaped``, of another shape."""
    if key not in state:
        return None
    value = state.pop(key)
    if tuple(value.shape) != tuple(expected):
        mis_shaped[key] = (tuple(value.shape), tuple(expected))
        return None
    return value


def _carry_as_is(state: Dict[str, Tensor], model_state: Mapping[str, Tensor], source: str,
                 target: str, layout: AttentionLayout,
                 mis_shaped: Dict[str, Tuple[Shape, Shape]]) -> List[Tuple[str, str]]:
    """A mixer in the stock layout (``qkv``, ``proj``): the tensors move unchanged."""
    carried = []
    for src, dst in _stock_layout_pairs(layout):
        if target + dst not in model_state:
            continue
        value = _take(state, source + src, tuple(model_state[target + dst].shape), mis_shaped)
        if value is not None:
            state[target + dst] = value
            carried.append((source + src, target + dst))
    return carried


def _carry_into_qkvg(state: Dict[str, Tensor], model_state: Mapping[str, Tensor], source: str,
                     target: str, layout: AttentionLayout,
                     mis_shaped: Dict[str, Tuple[Shape, Shape]]
                     ) -> Tuple[List[Tuple[str, str]], List[str]]:
    """A gated mixer: q | k | v into ``qkvg``'s first 3C rows, the projection into
    ``out_proj``; the gate rows are new."""
    carried, new = [], []
    width = model_state[f'{target}qkvg.weight'].shape[1]
    rows = 3 * width
    no_bias = source + layout.qkv_bias not in state
    weight = _take(state, source + layout.qkv_weight, (rows, width), mis_shaped)
    bias = _take(state, source + layout.qkv_bias, (rows,), mis_shaped)
    bias_source = source + layout.qkv_bias
    if weight is not None and no_bias:
        # the upstream projection has no bias: the same function has zero bias rows
        bias, bias_source = weight.new_zeros(rows), '(no q/k/v bias upstream: zeros)'
    for kind, value, src in (('weight', weight, source + layout.qkv_weight),
                             ('bias', bias, bias_source)):
        if value is not None:
            rows_of = model_state[f'{target}qkvg.{kind}'].clone()
            rows_of[:rows] = value
            state[f'{target}qkvg.{kind}'] = rows_of
            carried.append((src, f'{target}qkvg.{kind}[:{rows}]'))
            new.append(f'{target}qkvg.{kind}[{rows}:]')
    for src, dst in ((layout.proj_weight, 'out_proj.weight'),
                     (layout.proj_bias, 'out_proj.bias')):
        value = _take(state, source + src, tuple(model_state[target + dst].shape), mis_shaped)
        if value is not None:
            state[target + dst] = value
            carried.append((source + src, target + dst))
    return carried, new


class SwappedAttention(nn.Module):
    """What takes a stock attention module's place: the token mixer (``mixer``, the name
    swapped checkpoints carry: ``<attention>.mixer.qkvg.weight``) and the stock module's two
    dropouts, reused (``proj_drop`` after the output projection, ``drop_path`` on the residual
    branch). A family subclasses it with the stock module's ``forward`` signature."""

    def __init__(self, mixer: nn.Module, proj_drop: nn.Module, drop_path: nn.Module):
        super().__init__()
        self.mixer = mixer
        self.proj_drop = proj_drop
        self.drop_path = drop_path

    def branch(self, tokens: Tensor, hw_shape: Sequence[int], num_prefix: int = 0) -> Tensor:
        """``(B, num_prefix + H*W, C)`` tokens -> the residual branch
        ``drop_path(proj_drop(mixer(tokens)))``, the same shape."""
        return self.drop_path(self.proj_drop(
            self.mixer(tokens, hw_shape=hw_shape, num_prefix=num_prefix)))


class SwappedAttentionMixin:
    """Mixed in before a stock backbone class; a family defines the hooks below.

    Takes ``mixers`` (one entry per stage, or per layer in a ViT; ``'softmax'`` keeps the stock
    module, see :mod:`nala_mm.models.mixer_specs`), ``mode`` (``'fast' | 'reference'``, for
    every swapped mixer: :mod:`nala_mm.ops.mode`) and ``pretrained_mismatch`` (``'raise' |
    'skip'``: what a ``Pretrained`` checkpoint's tensor of another shape than the model's does,
    :meth:`carry_over_checkpoint`), and passes every other argument to the stock parent.
    """
    # the upstream attention a swapped block replaces (what :func:`carry_over` maps)
    attention_layout: AttentionLayout
    # what one ``mixers`` entry is for, in messages and the carry-over log
    mixer_unit = 'stage'

    def __init__(self, mixers: Sequence[MixerEntry] = DEFAULT_HYBRID, mode: str = 'fast',
                 pretrained_mismatch: str = 'raise', **kwargs):
        if pretrained_mismatch not in PRETRAINED_MISMATCH:  # before the parent builds anything
            raise ValueError(f'pretrained_mismatch={pretrained_mismatch!r}; expected one of '
                             f'{PRETRAINED_MISMATCH}')
        self.pretrained_mismatch = pretrained_mismatch
        super().__init__(**kwargs)
        resolve_mode(mode)  # validates
        self.mode = mode
        self._swap_units(mixers)

    # ------------------------------------------------------------------ family hooks
    # (called by this class only; public ones below are also what the attention transfer uses)
    def _num_units(self) -> int:
        """How many ``mixers`` entries the backbone takes."""
        raise NotImplementedError

    def _unit_blocks(self, unit: int) -> Sequence[nn.Module]:
        """The blocks of stage or layer ``unit``, each with its attention module in ``.attn``."""
        raise NotImplementedError

    def _global_attention(self, stock: nn.Module, mixer_cfg: dict) -> SwappedAttention:
        """The module that takes ``stock``'s place and runs the mixer ``mixer_cfg`` (built with
        ``build_mixer(mixer_cfg, ..., self.mode)``)."""
        raise NotImplementedError

    def _after_swap(self) -> None:
        """Re-apply what the parent did in ``__init__`` to modules the swap replaced."""

    def upstream_state(self, checkpoint: Mapping) -> Dict[str, Tensor]:
        """A loaded upstream checkpoint -> backbone-relative tensors in this class's layout
        (the parent's converter applied where it has one). A family with a converter
        overrides it; the stock teacher of the attention transfer is loaded through it."""
        return backbone_state_dict(checkpoint)

    def adapt_state(self, state: Dict[str, Tensor],
                    model_state: Mapping[str, Tensor]) -> Dict[str, Tensor]:
        """What the parent's ``init_weights`` does to the tensors it keeps, for a model whose
        ``state_dict()`` is ``model_state`` (this backbone, or its stock parent built with the
        same arguments): resizing position tables to its sizes. Default: nothing."""
        return state

    def in_own_layout(self, state: Mapping[str, Tensor]) -> bool:
        """Whether most of ``state``'s keys are this backbone's own (a file written from this
        model or from its stock parent in the package's layout), so that a converter from an
        official layout must not run on it again."""
        own = self.state_dict().keys()
        return bool(state) and 2 * sum(key in own for key in state) >= len(state)

    def before_blocks(self, inputs: Tensor) -> None:
        """Prepare for calling blocks on their own, outside a forward of the whole backbone
        (the attention transfer feeds each block its teacher's input): default nothing."""

    # ------------------------------------------------------------------ shared
    def _swap_units(self, mixers: Sequence[MixerEntry]) -> None:
        """Put the mixers in place, once the stock parent has built its blocks."""
        cfgs = resolve_mixers(mixers, self._num_units(), self.mixer_unit, keep_stock=True)
        self.mixers = tuple(mixers)
        unit_of: Dict[int, int] = {}  # id of a swapped attention module -> its unit
        for unit, cfg in enumerate(cfgs):
            if cfg is None:
                continue
            for block in self._unit_blocks(unit):
                block.attn = self._global_attention(block.attn, cfg)
                unit_of[id(block.attn)] = unit
        # the swapped attention modules, named as the state dict spells them
        # ('stages.0.blocks.1.attn'), in forward order -> their unit (stage or layer)
        self.swapped_names: Dict[str, int] = {
            name: unit_of[id(module)] for name, module in self.named_modules()
            if id(module) in unit_of}
        self._convs_through_op()
        self._after_swap()

    def _convs_through_op(self) -> None:
        """Every plain 2D convolution of the backbone (patch embeddings, Mix-FFN convs, spatial
        reductions) becomes a :class:`TokenConv2d`, in place: the same parameters, names and
        forward, trained through the custom op ``nala_mm::conv2d``. Compiled at changing input
        sizes, inductor's own lowering of a stock convolution fails on the stock Mix-FFN's
        depthwise conv (an invalid value range) or recompiles per size (its backward guards the
        input's strides; :mod:`nala_mm.apis.compile`); the op's node does neither."""
        from mmcv.cnn.bricks.wrappers import Conv2d as EmptyTolerantConv2d
        for module in self.modules():
            if (type(module) in (nn.Conv2d, EmptyTolerantConv2d) and module.dilation == (1, 1)
                    and module.padding_mode == 'zeros' and not isinstance(module.padding, str)):
                module.__class__ = TokenConv2d
                module.mode = self.mode

    def stage_of(self, module_name: str) -> Optional[int]:
        """The stage (a layer, in a ViT) that holds the submodule ``module_name``, or ``None``
        (the attention statistics ask it)."""
        module = self.get_submodule(module_name)
        for unit in range(self._num_units()):
            if any(module is inner for block in self._unit_blocks(unit)
                   for inner in block.modules()):
                return unit
        return None

    def _pretrained_checkpoint(self) -> Optional[str]:
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            return cfg['checkpoint']
        return None

    @classmethod
    def stock_parent(cls) -> type:
        """The stock backbone class this one swaps into (the attention transfer's teacher)."""
        return next(parent for parent in cls.__mro__[1:]
                    if not issubclass(parent, SwappedAttentionMixin))

    def init_weights(self) -> None:
        """As the parent, except that a ``Pretrained`` checkpoint goes through
        :meth:`carry_over_checkpoint`, also when every unit keeps its stock module: its
        attention weights are carried into the swapped mixers, and it loads exactly or refuses.
        The outcome is logged per stage or layer."""
        path = self._pretrained_checkpoint()
        if path is None:
            super().init_weights()
            return
        logger = MMLogger.get_current_instance()
        checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu', logger=logger)
        state, report = self.carry_over_checkpoint(checkpoint, path)
        if report.mis_shaped:  # only with 'skip': 'raise' raised above
            logger.warning(
                f"{type(self).__name__}: pretrained_mismatch='skip': "
                f'{_tensors(len(report.mis_shaped))} of {path} with a shape other than the '
                f"model's keep their initialisation (checkpoint vs model):\n  "
                + '\n  '.join(describe_shapes(report.mis_shaped)))
        load_state_dict(self, state, strict=False, logger=logger)
        self.carry_over_report: CarryOverReport = report
        model_keys = self.state_dict().keys()
        # every key of both has the model's shape now: those are the tensors that loaded
        loaded = sum(key in state for key in model_keys)
        units = (f'attention carried into the swapped {self.mixer_unit}s:\n  ' + '\n  '.join(
            report.lines(self.swapped_names, self.mixer_unit)) if self.swapped_names
            else f'every {self.mixer_unit} keeps its stock attention')
        logger.info(f'{type(self).__name__}: {loaded} of {len(model_keys)} tensors from '
                    f'{path}; {units}')

    def carry_over_checkpoint(self, checkpoint: Mapping, source: str = 'the checkpoint'
                              ) -> Tuple[Dict[str, Tensor], CarryOverReport]:
        """A stock (or swapped) checkpoint's contents -> the state dict to load into this
        backbone, and the carry-over report.

        After the carry-over and :meth:`adapt_state` (what the parent's ``init_weights`` does:
        converted layouts, resized position tables), every tensor must have the model's shape.
        With ``pretrained_mismatch='raise'`` one that does not raises a ``ValueError`` naming it,
        both shapes and ``source``; with ``'skip'`` it is left out of the state dict (the model
        keeps it as initialised) and listed in ``report.mis_shaped``. Also raises when nothing
        in the checkpoint fits the backbone."""
        state = self.upstream_state(checkpoint)
        model_state = self.state_dict()
        state, report = carry_over(state, model_state, self.swapped_names, self.attention_layout)
        state = self.adapt_state(state, model_state)
        report.mis_shaped.update(shape_mismatches(state, model_state))
        if report.mis_shaped and self.pretrained_mismatch == 'raise':
            raise ValueError(
                f'{type(self).__name__}: {_tensors(len(report.mis_shaped))} of {source} with a '
                f"shape other than the model's (checkpoint vs model; a q/k/v or projection "
                f'carried into a mixer against the mixer rows it fills):\n  '
                + '\n  '.join(describe_shapes(report.mis_shaped))
                + '\nIs the config\'s architecture the checkpoint\'s (in_channels, embed_dims, '
                'num_heads, the FFN ratio)? To load the rest and keep these tensors as '
                "initialised, build the backbone with pretrained_mismatch='skip'.")
        for key in report.mis_shaped:
            state.pop(key, None)  # carry_over already took out the attention tensors
        if not any(key in model_state for key in state):
            stock = self.stock_parent()
            skipped = (f'; {_tensors(len(report.mis_shaped))} of another shape skipped'
                       if report.mis_shaped else '')
            raise ValueError(f'{type(self).__name__}: no tensor of {source} matches a parameter '
                             f'of the backbone (first keys: {sorted(state)[:5]}{skipped}); '
                             f'expected a checkpoint of {stock.__module__}.{stock.__name__}')
        return state, report


def _tensors(count: int) -> str:
    return f'{count} tensor{"" if count == 1 else "s"}'
