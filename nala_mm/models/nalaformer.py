"""NaLaFormer backbone for dense prediction, registered for mmseg and mmdet.

The architecture is the authors' (docs/user_guides/method.md, "Block and backbone"): a conv stem,
four stages of
blocks (LePE-style conv, token mixer, conv, conv-FFN) with conv downsamples between them. Module
and parameter names follow the authors' classification code, so their checkpoints load once
:func:`nala_mm.models.pretrained.checkpoint_filter` has dropped the classification tail.
"""
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from ..ops import gelu_conv, resolve_mode
from ..ops.token_shard import recompute_in_same_shard
from ..registry import register_model
from .depthwise import ResidualDepthwiseConv, TokenConv2d, conv_tokens, with_row_halo
from .mixer_specs import DEFAULT_HYBRID, MixerEntry, build_mixer, resolve_mixers
from .pretrained import load_pretrained

# Variants as data: per-stage widths, depths, heads, MLP ratios and LayerScale initial values, and
# the stochastic-depth rate the authors trained each with (docs/user_guides/method.md, "Block and
# backbone").
# The authors' checkpoint of each variant is described in nala_mm.models.pretrained.PRETRAINED.
ARCH_SETTINGS: Dict[str, dict] = {
    'xt': dict(embed_dims=(32, 64, 128, 384), depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 12),
               mlp_ratios=(3.5,) * 4, drop_path_rate=0.10, layer_scale_init_values=(1.0,) * 4),
    't': dict(embed_dims=(64, 128, 256, 512), depths=(2, 2, 6, 2), num_heads=(1, 2, 4, 8),
              mlp_ratios=(4.0,) * 4, drop_path_rate=0.10, layer_scale_init_values=(1.0,) * 4),
    's': dict(embed_dims=(64, 128, 320, 512), depths=(3, 5, 9, 3), num_heads=(1, 2, 5, 8),
              mlp_ratios=(3.5,) * 4, drop_path_rate=0.15, layer_scale_init_values=(1.0,) * 4),
    'b': dict(embed_dims=(96, 192, 384, 512), depths=(4, 6, 12, 6), num_heads=(1, 2, 6, 8),
              mlp_ratios=(4.0,) * 4, drop_path_rate=0.40,
              layer_scale_init_values=(1.0, 1.0, 1e-6, 1e-6)),
    'l': dict(embed_dims=(96, 192, 448, 640), depths=(4, 7, 19, 8), num_heads=(1, 2, 7, 10),
              mlp_ratios=(3.5,) * 4, drop_path_rate=0.55, layer_scale_init_values=(1e-6,) * 4),
}
PER_STAGE_KEYS = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'layer_scale_init_values')
NUM_STAGES = 4
# The blocks' LayerNorms, as released; and the per-output norm Swin uses for dense prediction.
BLOCK_NORM_CFG = dict(type='LN', eps=1e-6)
DEFAULT_OUT_NORM_CFG = dict(type='LN', eps=1e-6)


def resolve_arch(arch: Union[str, dict]) -> dict:
    """Variant name or explicit dict -> validated per-stage settings."""
    if isinstance(arch, str):
        if arch.lower() not in ARCH_SETTINGS:
            raise ValueError(f'unknown NaLaFormer arch {arch!r}; expected one of '
                             f'{sorted(ARCH_SETTINGS)} or a dict with keys {PER_STAGE_KEYS}')
        return dict(ARCH_SETTINGS[arch.lower()])
    if not isinstance(arch, dict):
        raise TypeError(f'arch must be a str or dict, got {type(arch).__name__}')
    unknown = sorted(set(arch) - set(PER_STAGE_KEYS) - {'drop_path_rate'})
    if unknown:  # e.g. 'mlp_ratio' for 'mlp_ratios' would otherwise fall back to a default
        raise ValueError(f'arch dict has unknown keys {unknown}; expected keys '
                         f"{PER_STAGE_KEYS + ('drop_path_rate',)}")
    settings = dict(arch)
    settings.setdefault('mlp_ratios', (4.0,) * NUM_STAGES)
    settings.setdefault('layer_scale_init_values', (1.0,) * NUM_STAGES)
    settings.setdefault('drop_path_rate', 0.1)
    missing = [key for key in PER_STAGE_KEYS if key not in settings]
    if missing:
        raise ValueError(f'arch dict is missing {missing}; it needs {PER_STAGE_KEYS}')
    for key in PER_STAGE_KEYS:
        if len(settings[key]) != NUM_STAGES:
            raise ValueError(f'arch[{key!r}] must have {NUM_STAGES} entries (one per stage), got '
                             f'{len(settings[key])}: {settings[key]}')
    return settings


def to_tokens(x: Tensor) -> Tensor:
    """``(B, C, H, W)`` map -> contiguous channels-last tokens ``(B, H, W, C)``."""
    return x.permute(0, 2, 3, 1).contiguous()


def to_map(tokens: Tensor) -> Tensor:
    """Channels-last tokens -> a ``(B, C, H, W)`` view in ``torch.channels_last`` memory."""
    return tokens.permute(0, 3, 1, 2)


class TokenNorm(nn.Module):
    """A norm layer built from ``norm_cfg`` (mmcv's ``build_norm_layer``), applied to the
    channels of tokens ``(B, H, W, C)``; kept as attribute ``norm`` so that parameters are named
    ``<name>.norm.weight`` as in the authors' checkpoints.

    LayerNorm-like layers normalise the tokens' last dim directly; norms that normalise dim 1
    (batch, group and instance norms) see the tokens' channels-first view.
    """

    def __init__(self, channels: int, norm_cfg: dict):
        super().__init__()
        self.norm = build_norm_layer(norm_cfg, channels)[1]
        self.channels_first = isinstance(self.norm, (_BatchNorm, nn.GroupNorm, _InstanceNorm))

    def forward(self, tokens: Tensor) -> Tensor:
        if self.channels_first:
            return self.norm(to_map(tokens)).permute(0, 2, 3, 1)
        return self.norm(tokens)


class ConvFFN(nn.Module):
    """Linear -> GELU -> h + dwconv3x3(h) -> Linear, on channels-last tokens (``dwconv``
    includes its residual).

    Training runs GELU and the conv as one node (:func:`nala_mm.ops.gelu_conv`) that keeps one
    hidden-width tensor fewer for the backward; inference applies GELU in place on ``fc1``'s
    output, which nothing else holds.
    """

    def __init__(self, channels: int, hidden: int, mode: str = 'fast'):
        super().__init__()
        resolve_mode(mode)  # validates
        self.mode = mode
        self.fc1 = nn.Linear(channels, hidden)
        self.dwconv = ResidualDepthwiseConv(hidden, mode=mode)
        self.fc2 = nn.Linear(hidden, channels)

    def forward(self, tokens: Tensor) -> Tensor:
        hidden = to_map(self.fc1(tokens))
        if torch.is_grad_enabled() or resolve_mode(self.mode) == 'reference':
            hidden, padding = with_row_halo(hidden, self.dwconv.padding)
            hidden = gelu_conv(hidden, self.dwconv.kernel(), self.dwconv.bias, padding,
                               self.dwconv.groups, mode=self.mode)
        else:
            hidden = self.dwconv(torch.ops.aten.gelu_(hidden))
        return self.fc2(hidden.permute(0, 2, 3, 1))


class NaLaBlock(nn.Module):
    """cpe1 -> attention -> cpe2 -> FFN, each residual; LayerScale and DropPath on the branches.

    Runs on contiguous channels-last tokens ``(B, H, W, C)`` end to end: the norms, projections
    and residual adds read contiguous memory and no layout copy is made (the released block
    switches between channels-first maps and token views around every sub-layer).
    """

    def __init__(self, channels: int, num_heads: int, mlp_ratio: float, mixer_cfg: dict,
                 layer_scale_init: float, drop_path: float, with_cp: bool, mode: str = 'fast'):
        super().__init__()
        self.cpe1 = ResidualDepthwiseConv(channels, mode=mode)  # x + dwconv(x)
        self.norm1 = TokenNorm(channels, BLOCK_NORM_CFG)
        self.attn = build_mixer(mixer_cfg, channels, num_heads, mode)
        self.cpe2 = ResidualDepthwiseConv(channels, mode=mode)
        self.norm2 = TokenNorm(channels, BLOCK_NORM_CFG)
        self.ffn = ConvFFN(channels, int(channels * mlp_ratio), mode)
        # (1, C, 1, 1) as in the authors' checkpoints; applied over the tokens' last dim
        self.gamma_1 = nn.Parameter(torch.full((1, channels, 1, 1), float(layer_scale_init)))
        self.gamma_2 = nn.Parameter(torch.full((1, channels, 1, 1), float(layer_scale_init)))
        self.drop_path_rate = float(drop_path)
        self.with_cp = with_cp

    def _residual(self, x: Tensor, gamma: Tensor, branch: Tensor) -> Tensor:
        """``x + DropPath(gamma * branch)`` as one ``addcmul`` pass: DropPath's per-sample
        keep mask (drawn as mmcv's ``DropPath`` draws it) scales gamma, a ``(B, 1, 1, C)``
        factor, instead of three passes over the branch and a kept full-size product."""
        scale = gamma.view(-1)
        if self.training and self.drop_path_rate > 0:
            keep = 1.0 - self.drop_path_rate
            mask = torch.rand((x.shape[0], 1, 1, 1), dtype=x.dtype, device=x.device)
            scale = scale * mask.add_(keep).floor_().div_(keep)
        return torch.addcmul(x, scale, branch)

    def _forward(self, x: Tensor) -> Tensor:
        x = conv_tokens(self.cpe1, x)
        x = self._residual(x, self.gamma_1, self.attn(self.norm1(x)))
        x = conv_tokens(self.cpe2, x)
        return self._residual(x, self.gamma_2, self.ffn(self.norm2(x)))

    def forward(self, x: Tensor) -> Tensor:
        if self.with_cp and x.requires_grad:
            # the recomputation runs in the backward: it re-enters a token-parallel call's
            # shard (no-op outside one)
            return cp.checkpoint(self._forward, x, use_reentrant=False,
                                 context_fn=recompute_in_same_shard)
        return self._forward(x)


class NaLaStage(nn.Module):
    """Blocks at one resolution on channels-last tokens, then (stages 1-3) a conv3x3/s2 + BN
    downsample, whose output tokens feed the next stage."""

    def __init__(self, blocks: nn.ModuleList, downsample: Optional[nn.Module]):
        super().__init__()
        self.blocks = blocks
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        for block in self.blocks:
            x = block(x)
        return x, (conv_tokens(self.downsample, x) if self.downsample is not None else x)


class Downsample(nn.Module):

    def __init__(self, in_channels: int, out_channels: int, norm_cfg: dict, mode: str = 'fast'):
        super().__init__()
        self.reduction = TokenConv2d(in_channels, out_channels, 3, stride=2, padding=1,
                                     mode=mode)
        self.norm = build_norm_layer(norm_cfg, out_channels)[1]

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.reduction(x))


class PatchEmbed(nn.Module):
    """Stride-4 conv stem: 3x3/s2, 3x3, 3x3, 3x3/s2 (indices 0..10 as in the authors' code)."""

    def __init__(self, in_channels: int, out_channels: int, norm_cfg: dict, mode: str = 'fast'):
        super().__init__()
        mid = out_channels // 2

        def conv_bn(cin: int, cout: int, stride: int):
            return [TokenConv2d(cin, cout, 3, stride=stride, padding=1, mode=mode),
                    build_norm_layer(norm_cfg, cout)[1]]

        self.proj = nn.Sequential(
            *conv_bn(in_channels, mid, 2), nn.GELU(),
            *conv_bn(mid, mid, 1), nn.GELU(),
            *conv_bn(mid, mid, 1), nn.GELU(),
            *conv_bn(mid, out_channels, 2))

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


@register_model
class NaLaFormer(BaseModule):
    """NaLaFormer: hierarchical backbone with norm-aware linear attention.

    Args:
        arch: ``'xt' | 't' | 's' | 'b' | 'l'`` or a dict with ``embed_dims, depths, num_heads``
            (and optionally ``mlp_ratios, layer_scale_init_values, drop_path_rate``).
        mixers: per stage a token mixer: a shorthand (``'nala'``, ``'linear'``, ``'softmax'``;
            :mod:`nala_mm.models.mixer_specs`) or a registered mixer's config without its sizes,
            such as ``dict(type='NormAwareLinearAttention', kernel='relu')``. Default: the
            released hybrid ``('nala', 'nala', 'softmax', 'softmax')``. Every mixer has the same
            parameters, so any checkpoint loads into any choice (docs/user_guides/mixers.md).
        in_channels: image channels.
        out_indices: stages whose features (before the downsample) are returned.
        out_norm_cfg: norm applied to each returned map, as its own module ``out_norm{i}``
            (Swin's convention for dense prediction); ``None`` returns the raw stage features,
            with the per-position magnitude a per-pixel LayerNorm discards.
        drop_path_rate: stochastic depth, linearly increasing; ``None`` = the variant's.
        frozen_stages: -1 trains all; 0 freezes the stem; i freezes the stem and stages 1..i.
        norm_eval: keep BatchNorm layers in eval mode while training.
        with_cp: activation checkpointing per block (less memory, one more forward).
        norm_cfg: norm of the stem and downsample convs (``dict(type='SyncBN')`` for DDP).
        mode: ``'fast'`` or ``'reference'`` for every op with two paths: the mixers' attention,
            gate norm and LePE, the FFN's GELU + conv, the downsample convs
            (:mod:`nala_mm.ops.mode`; same numbers, the reference keeps more for the backward).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH, use_ema=False)`` loads the authors'
            classification checkpoint, a converted one or a whole detector/segmentor's (see
            :mod:`nala_mm.models.pretrained`); anything else is mmengine's initialisation.
    """

    def __init__(self, arch: Union[str, dict] = 't',
                 mixers: Sequence[MixerEntry] = DEFAULT_HYBRID,
                 in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 out_norm_cfg: Optional[dict] = DEFAULT_OUT_NORM_CFG,
                 drop_path_rate: Optional[float] = None, frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False,
                 norm_cfg: dict = dict(type='BN', requires_grad=True),
                 mode: str = 'fast', init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        resolve_mode(mode)  # validates
        settings = resolve_arch(arch)
        mixer_cfgs = resolve_mixers(mixers, NUM_STAGES)
        out_indices = tuple(out_indices)
        if not out_indices or any(not 0 <= i < NUM_STAGES for i in out_indices):
            raise ValueError(f'out_indices must be non-empty and within 0..{NUM_STAGES - 1}, got '
                             f'{out_indices}')
        if not -1 <= frozen_stages <= NUM_STAGES:
            raise ValueError(f'frozen_stages must be in -1..{NUM_STAGES}, got {frozen_stages}')
        if drop_path_rate is None:
            drop_path_rate = settings['drop_path_rate']

        self.arch_settings = settings
        self.variant = arch.upper() if isinstance(arch, str) else 'custom'
        self.mixers = tuple(mixers)
        self.in_channels = in_channels
        self.embed_dims = tuple(settings['embed_dims'])
        self.out_indices = out_indices
        self.out_norm_cfg = None if out_norm_cfg is None else dict(out_norm_cfg)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.mode = mode

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims[0], norm_cfg, mode)
        depths = settings['depths']
        # on the CPU whatever the default device (a model built on 'meta' for its shapes)
        drop_rates = torch.linspace(0, drop_path_rate, sum(depths), device='cpu').tolist()
        self.layers = nn.ModuleList()
        for i in range(NUM_STAGES):
            first = sum(depths[:i])
            blocks = nn.ModuleList(
                NaLaBlock(self.embed_dims[i], settings['num_heads'][i], settings['mlp_ratios'][i],
                          mixer_cfgs[i], settings['layer_scale_init_values'][i],
                          drop_rates[first + j], with_cp, mode)
                for j in range(depths[i]))
            downsample = Downsample(self.embed_dims[i], self.embed_dims[i + 1], norm_cfg, mode) \
                if i < NUM_STAGES - 1 else None
            self.layers.append(NaLaStage(blocks, downsample))
        # Per-output norms, named so they cannot collide with the authors' top-level ``norm.*``;
        # parameter-free identities without a norm, so loading, freezing and forward stay one path.
        for i in out_indices:
            self.add_module(f'out_norm{i}', nn.Identity() if out_norm_cfg is None
                            else TokenNorm(self.embed_dims[i], out_norm_cfg))
        self._freeze_stages()

    # ------------------------------------------------------------------ initialisation
    def init_weights(self) -> None:
        """``init_cfg`` as mmengine takes it (a dict or a list of dicts); a ``'Pretrained'``
        entry loads through :func:`load_pretrained` (the authors' layout, a report of what
        loaded), after the other entries, as mmengine orders it."""
        entries = (list(self.init_cfg) if isinstance(self.init_cfg, (list, tuple))
                   else [] if self.init_cfg is None else [self.init_cfg])
        pretrained = [e for e in entries if e.get('type') == 'Pretrained']
        others = [e for e in entries if e.get('type') != 'Pretrained']
        if len(pretrained) > 1:
            raise ValueError(f'init_cfg has {len(pretrained)} Pretrained entries '
                             f'({[e.get("checkpoint") for e in pretrained]}); expected one')
        if others:
            whole, self.init_cfg = self.init_cfg, others
            try:
                super().init_weights()
            finally:
                self.init_cfg = whole
        if pretrained:
            load_pretrained(self, pretrained[0]['checkpoint'],
                            use_ema=pretrained[0].get('use_ema', False))
        if entries:
            return
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ training-mode control
    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        frozen = [self.patch_embed] + [self.layers[i] for i in range(self.frozen_stages)]
        frozen += [getattr(self, f'out_norm{i}') for i in range(self.frozen_stages)
                   if i in self.out_indices]
        for module in frozen:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self

    def stage_of(self, module_name: str) -> Optional[int]:
        """The stage (0-based) holding the submodule ``module_name`` (``'layers.2.blocks.1.attn'``
        -> 2); ``None`` for the stem and the output norms. The attention statistics ask it."""
        parts = module_name.split('.')
        return int(parts[1]) if len(parts) > 1 and parts[0] == 'layers' else None

    # ------------------------------------------------------------------ forward
    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        if not isinstance(x, Tensor):
            raise TypeError(f'NaLaFormer expects a Tensor (B, {self.in_channels}, H, W), got '
                            f'{type(x).__name__}')
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'NaLaFormer expects input (B, {self.in_channels}, H, W), got '
                             f'{tuple(x.shape)}')
        # the stem stays channels-first (its dense convs' backward is slower in channels-last
        # memory on CPU); one copy turns its output into tokens
        x = to_tokens(self.patch_embed(x))
        outs = []
        for i, stage in enumerate(self.layers):
            features, x = stage(x)
            if i in self.out_indices:
                # channels-first and contiguous, as dense heads (and users' .view()) expect
                outs.append(to_map(getattr(self, f'out_norm{i}')(features)).contiguous())
        return tuple(outs)
