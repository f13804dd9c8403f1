"""What the swapped stock backbones share: per-stage ``mixers``, the swap, the weight carry-over.

:class:`SwappedAttentionMixin` holds the shared logic; :class:`SwinStages` and
:class:`SpatialReductionStages` say, for each family of stock backbones, where a stage's blocks
are and what replaces one block's attention. A registered backbone (``seg.py``, ``det.py``) is a
family mixin before its stock parent, plus the parent's way of reading checkpoints.
"""
from typing import Dict, List, Mapping, Optional, Sequence, Union

from mmengine.logging import MMLogger
from mmengine.runner.checkpoint import CheckpointLoader, load_state_dict
from torch import Tensor, nn

from .adapters import full_resolution, window_free
from .carry_over import (SPATIAL_REDUCTION_ATTENTION, SWIN_WINDOW_ATTENTION, AttentionLayout,
                         CarryOverReport, carry_over, resize_relative_position_tables)

# 'softmax' keeps the stock attention module (windowed in Swin, spatial-reduction in MiT/PVTv2);
# the others put a global mixer in every block of the stage
KEEP_STOCK = 'softmax'
SWAP_SHORTHANDS: Dict[str, dict] = {
    'nala': dict(type='NormAwareLinearAttention'),
    'linear': dict(type='LinearAttention'),
}
DEFAULT_SWAP_MIXERS = ('nala', 'nala', 'softmax', 'softmax')
StageMixer = Union[str, dict]


def resolve_stage_mixers(mixers: Sequence[StageMixer], num_stages: int) -> List[Optional[dict]]:
    """``mixers`` -> per stage the mixer config to build, or ``None`` to keep the stock module."""
    if isinstance(mixers, (str, dict)) or len(mixers) != num_stages:
        raise ValueError(f'mixers needs one entry per stage ({num_stages}), got {mixers!r}')
    resolved: List[Optional[dict]] = []
    for entry in mixers:
        if entry == KEEP_STOCK:
            resolved.append(None)
        elif isinstance(entry, str) and entry in SWAP_SHORTHANDS:
            resolved.append(dict(SWAP_SHORTHANDS[entry]))
        elif isinstance(entry, dict) and 'type' in entry:
            if {'embed_dims', 'num_heads'} & set(entry):
                raise ValueError(f'a mixer config takes its sizes from the stage; remove '
                                 f'embed_dims/num_heads from {entry}')
            resolved.append(dict(entry))
        else:
            raise ValueError(f'unknown stage mixer {entry!r}; expected {KEEP_STOCK!r} (the stock '
                             f'attention), one of {tuple(SWAP_SHORTHANDS)}, or a registered '
                             f"mixer's config such as dict(type='NormAwareLinearAttention', "
                             f"kernel='relu')")
    return resolved


class SwappedAttentionMixin:
    """Mixed in before a stock backbone class; a family mixin defines the hooks below.

    Takes ``mixers`` (one entry per stage, see :func:`resolve_stage_mixers`) and passes every
    other argument to the stock parent.
    """
    # the upstream attention a swapped block replaces (what :func:`carry_over` maps)
    attention_layout: AttentionLayout

    def __init__(self, mixers: Sequence[StageMixer] = DEFAULT_SWAP_MIXERS, **kwargs):
        super().__init__(**kwargs)
        self._swap_stages(mixers)

    def _num_stages(self) -> int:
        raise NotImplementedError

    def _stage_blocks(self, stage: int) -> Sequence[nn.Module]:
        """The blocks of ``stage``, each with its attention module in ``.attn``."""
        raise NotImplementedError

    def _global_attention(self, stock: nn.Module, mixer_cfg: dict) -> nn.Module:
        """The module that takes ``stock``'s place and runs the mixer ``mixer_cfg``."""
        raise NotImplementedError

    def _upstream_state(self, checkpoint: Mapping) -> Dict[str, Tensor]:
        """A loaded upstream checkpoint -> backbone-relative tensors in this class's layout
        (the parent's ``convert_weights`` applied when it has one)."""
        return strip_prefixes(extract_state(checkpoint))

    def _adapt_state(self, state: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """What the parent's ``init_weights`` does to the tensors it keeps (default: nothing)."""
        return state

    # ------------------------------------------------------------------ shared
    def _swap_stages(self, mixers: Sequence[StageMixer]) -> None:
        """Put the mixers in place, once the stock parent has built its stages."""
        self.mixers = tuple(mixers)
        stage_of: Dict[int, int] = {}  # id of a swapped attention module -> its stage
        for stage, cfg in enumerate(resolve_stage_mixers(mixers, self._num_stages())):
            if cfg is None:
                continue
            for block in self._stage_blocks(stage):
                block.attn = self._global_attention(block.attn, cfg)
                stage_of[id(block.attn)] = stage
        # names as the state dict spells them ('stages.0.blocks.1.attn') -> stage
        self._swapped_names: Dict[str, int] = {
            name: stage_of[id(module)] for name, module in self.named_modules()
            if id(module) in stage_of}

    def _pretrained_checkpoint(self) -> Optional[str]:
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            return cfg['checkpoint']
        return None

    def init_weights(self) -> None:
        """As the parent, except that a checkpoint's attention weights are carried into the
        swapped stages' mixers (:func:`carry_over`) and the outcome is logged per stage."""
        path = self._pretrained_checkpoint()
        if path is None or not self._swapped_names:
            super().init_weights()
            return
        logger = MMLogger.get_current_instance()
        checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu', logger=logger)
        state = self._upstream_state(checkpoint)
        model_state = self.state_dict()
        state, report = carry_over(
            state, model_state, {name: self.attention_layout for name in self._swapped_names})
        state = self._adapt_state(state)
        matched = [key for key in state if key in model_state]
        if not matched:
            stock = next(cls for cls in type(self).__mro__[1:]
                         if not issubclass(cls, SwappedAttentionMixin))
            raise ValueError(f'{type(self).__name__}: no tensor of {path} matches a parameter of '
                             f'the backbone (first keys: {sorted(state)[:5]}); expected a '
                             f'checkpoint of {stock.__module__}.{stock.__name__}')
        load_state_dict(self, state, strict=False, logger=logger)
        self.carry_over_report: CarryOverReport = report
        logger.info(f'{type(self).__name__}: {len(matched)} of {len(model_state)} tensors from '
                    f'{path}; attention carried into the swapped stages:\n  '
                    + '\n  '.join(report.lines(self._swapped_names)))


class SwinStages(SwappedAttentionMixin):
    """Swin (mmseg's or mmdet's): blocks in ``stages[i].blocks``; a swapped block's
    ``ShiftWindowMSA`` becomes a window-free global mixer; softmax stages' relative-position
    tables are resized to the model's window, as the stock ``init_weights`` does."""
    attention_layout = SWIN_WINDOW_ATTENTION

    def _num_stages(self):
        return len(self.stages)

    def _stage_blocks(self, stage):
        return self.stages[stage].blocks

    def _global_attention(self, stock, mixer_cfg):
        return window_free(stock, mixer_cfg)

    def _adapt_state(self, state):
        return resize_relative_position_tables(state, self.state_dict())


class SpatialReductionStages(SwappedAttentionMixin):
    """MiT and PVTv2: blocks in ``layers[i][1]``; a swapped block's spatial-reduction attention
    becomes a global mixer at full resolution."""
    attention_layout = SPATIAL_REDUCTION_ATTENTION

    def _num_stages(self):
        return len(self.layers)

    def _stage_blocks(self, stage):
        return self.layers[stage][1]

    def _global_attention(self, stock, mixer_cfg):
        return full_resolution(stock, mixer_cfg)


def extract_state(checkpoint: Mapping) -> Mapping[str, Tensor]:
    """The state dict inside a checkpoint (mmengine's ``state_dict``, timm/official ``model``)."""
    for key in ('state_dict', 'model'):
        if key in checkpoint and isinstance(checkpoint[key], Mapping):
            return checkpoint[key]
    return checkpoint


def strip_prefixes(state: Mapping[str, Tensor]) -> Dict[str, Tensor]:
    """Keys relative to the backbone: a whole detector's/segmentor's ``backbone.`` and a
    data-parallel ``module.`` prefix removed (the stock Swin's ``init_weights`` does the same)."""
    out = {}
    for key, value in state.items():
        key = key[len('module.'):] if key.startswith('module.') else key
        out[key[len('backbone.'):] if key.startswith('backbone.') else key] = value
    return out
