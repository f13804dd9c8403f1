"""NaLaFormer backbone for dense prediction (spec §2), registered for mmseg and mmdet.

Module names follow the authors' classification code (spec §3) so their checkpoints load after
:func:`nala_mm.models.checkpoint_filter.filter_authors_checkpoint` drops the classification tail.
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..ops import gelu_conv, is_exporting, rope_angle_buffer
from ..registry import register_model
from .attention import GatedAttention, NormAwareLinearAttention
from .checkpoint_filter import load_authors_checkpoint, missing_checkpoint_message
from .depthwise import ResidualDepthwiseConv, TokenConv2d, conv_tokens

# Variants as data (spec §2 table).
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
# Shorthands for the registered token mixers; a dict names any registered GatedAttention.
MIXER_SHORTHANDS = {'nala': 'NormAwareLinearAttention', 'softmax': 'SoftmaxAttention',
                    'linear': 'LinearAttention'}
NUM_STAGES = 4


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
    """LayerNorm over the channels of tokens ``(B, H, W, C)``; the authors' ``normX.norm``
    parameter names."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=eps)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.norm(tokens)


class ConvFFN(nn.Module):
    """Linear -> GELU -> h + dwconv3x3(h) -> Linear, on channels-last tokens (``dwconv``
    includes its residual)."""

    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(channels, hidden)
        self.dwconv = ResidualDepthwiseConv(hidden)
        self.fc2 = nn.Linear(hidden, channels)

    def forward(self, tokens: Tensor) -> Tensor:
        hidden = to_map(self.fc1(tokens))
        if torch.is_grad_enabled() and not is_exporting():
            # GELU and the residual dwconv as one node that saves only the pre-activation for
            # the backward (GELU is recomputed there): one hidden-width tensor fewer per block
            hidden = gelu_conv(hidden, self.dwconv.kernel(), self.dwconv.bias,
                               self.dwconv.padding, self.dwconv.groups)
        elif is_exporting():
            hidden = self.dwconv(F.gelu(hidden))
        else:  # inference: GELU in place on fc1's output, which nothing else holds
            hidden = self.dwconv(torch.ops.aten.gelu_(hidden))
        return self.fc2(hidden.permute(0, 2, 3, 1))


def mixer_config(attn_type: Union[str, dict], nala_kwargs: dict) -> dict:
    """A stage's ``attn_types`` entry -> the mixer's registry config (without its sizes).

    ``'nala'`` takes the backbone-wide NaLa settings (kernel, alpha, lam, tau); a dict is used
    as given, so ``dict(type='NormAwareLinearAttention', norm_aware=False)`` sets its own.
    """
    if isinstance(attn_type, str):
        if attn_type not in MIXER_SHORTHANDS:
            raise ValueError(f'unknown attention type {attn_type!r}; expected one of '
                             f'{tuple(MIXER_SHORTHANDS)} or a registered mixer config dict')
        cfg = dict(type=MIXER_SHORTHANDS[attn_type])
        if attn_type == 'nala':
            cfg.update(nala_kwargs)
        return cfg
    if isinstance(attn_type, dict) and 'type' in attn_type:
        if {'embed_dims', 'num_heads'} & set(attn_type):
            raise ValueError(f'a mixer config takes its sizes from the stage; remove embed_dims/'
                             f'num_heads from {attn_type}')
        return dict(attn_type)
    raise TypeError(f'an attn_types entry must be one of {tuple(MIXER_SHORTHANDS)} or a dict with '
                    f"a 'type', got {attn_type!r}")


def build_mixer(cfg: dict, channels: int, num_heads: int) -> GatedAttention:
    mixer = MODELS.build(dict(cfg, embed_dims=channels, num_heads=num_heads))
    if not isinstance(mixer, GatedAttention):
        raise TypeError(f'mixer {cfg["type"]!r} built a {type(mixer).__name__}; a token mixer '
                        f'must subclass nala_mm.models.GatedAttention (the shared qkvg/LePE/'
                        f'gate wrapper)')
    return mixer


class NaLaBlock(nn.Module):
    """cpe1 -> attention -> cpe2 -> FFN, each residual; LayerScale and DropPath on the branches.

    Runs on contiguous channels-last tokens ``(B, H, W, C)`` end to end: the norms, projections
    and residual adds read contiguous memory and no layout copy is made (the released block
    switches between channels-first maps and token views around every sub-layer).
    """

    def __init__(self, channels: int, num_heads: int, mlp_ratio: float, mixer_cfg: dict,
                 layer_scale_init: float, drop_path: float, with_cp: bool):
        super().__init__()
        self.cpe1 = ResidualDepthwiseConv(channels)  # x + dwconv(x)
        self.norm1 = TokenNorm(channels)
        self.attn = build_mixer(mixer_cfg, channels, num_heads)
        self.cpe2 = ResidualDepthwiseConv(channels)
        self.norm2 = TokenNorm(channels)
        self.ffn = ConvFFN(channels, int(channels * mlp_ratio))
        # (1, C, 1, 1) as in the authors' checkpoints; applied over the tokens' last dim
        self.gamma_1 = nn.Parameter(torch.full((1, channels, 1, 1), float(layer_scale_init)))
        self.gamma_2 = nn.Parameter(torch.full((1, channels, 1, 1), float(layer_scale_init)))
        self.drop_path_rate = float(drop_path)
        self.with_cp = with_cp

    def _residual(self, x: Tensor, gamma: Tensor, branch: Tensor) -> Tensor:
        """``x + DropPath(gamma * branch)`` as one ``addcmul`` pass: DropPath's per-sample
        keep mask (drawn as mmcv's ``DropPath`` draws it) scales gamma, a ``(B, 1, 1, C)``
        factor, instead of three passes over the branch and a kept full-size product
        (measured: NaLaFormer-T's 1024^2 training step, batch 2, 17.0 -> 15.0 s)."""
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
            return cp.checkpoint(self._forward, x, use_reentrant=False)
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

    def __init__(self, in_channels: int, out_channels: int, norm_cfg: dict):
        super().__init__()
        self.reduction = TokenConv2d(in_channels, out_channels, 3, stride=2, padding=1)
        self.norm = build_norm_layer(norm_cfg, out_channels)[1]

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.reduction(x))


class PatchEmbed(nn.Module):
    """Stride-4 conv stem: 3x3/s2, 3x3, 3x3, 3x3/s2 (indices 0..10 as in the authors' code)."""

    def __init__(self, in_channels: int, out_channels: int, norm_cfg: dict):
        super().__init__()
        mid = out_channels // 2

        def conv_bn(cin: int, cout: int, stride: int):
            return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1),
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
        attn_types: per stage a token mixer: ``'nala'``, ``'softmax'``, ``'linear'`` (plain
            linear attention), or a registered mixer's config dict such as
            ``dict(type='NormAwareLinearAttention', norm_aware=False)``; the released hybrid
            ``('nala', 'nala', 'softmax', 'softmax')`` by default.
        kernel, alpha, lam, tau: settings of every ``'nala'`` shorthand (see
            ``NormAwareLinearAttention``).
        in_channels: image channels.
        out_indices: stages whose features (before the downsample) are returned.
        out_norm: pass each returned map through its own LayerNorm ``out_norm{i}`` (as Swin does
            for pretrained dense prediction). Off returns the raw stage features, with each
            position's magnitude that a per-pixel LayerNorm discards (an earlier version's
            Mask R-CNN from scratch stalled at the class prior with the norms; the current one
            does not: README, detection demo).
        drop_path_rate: stochastic depth, linearly increasing; ``None`` = the variant's.
        frozen_stages: -1 trains all; 0 freezes the stem; i freezes the stem and stages 1..i.
        norm_eval: keep BatchNorm layers in eval mode while training.
        with_cp: activation checkpointing per block (less memory, one more forward).
        norm_cfg: norm of the stem and downsample convs (``dict(type='SyncBN')`` for DDP).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH, use_ema=False)`` loads the authors'
            classification checkpoint or a converted one; anything else is mmengine's init.
    """

    def __init__(self, arch: Union[str, dict] = 't',
                 attn_types: Sequence[Union[str, dict]] = ('nala', 'nala', 'softmax', 'softmax'),
                 kernel: str = 'cosine', alpha: float = 20.0, lam: float = 3.0,
                 tau: float = 0.5, in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3), out_norm: bool = True,
                 drop_path_rate: Optional[float] = None, frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False,
                 norm_cfg: dict = dict(type='BN', requires_grad=True),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        settings = resolve_arch(arch)
        attn_types = tuple(attn_types)
        if len(attn_types) != NUM_STAGES:
            raise ValueError(f'attn_types needs {NUM_STAGES} entries, got {attn_types}')
        nala_kwargs = dict(kernel=kernel, alpha=alpha, lam=lam, tau=tau)
        mixer_cfgs = [mixer_config(t, nala_kwargs) for t in attn_types]
        out_indices = tuple(out_indices)
        if not out_indices or any(not 0 <= i < NUM_STAGES for i in out_indices):
            raise ValueError(f'out_indices must be non-empty and within 0..{NUM_STAGES - 1}, got '
                             f'{out_indices}')
        if not -1 <= frozen_stages <= NUM_STAGES:
            raise ValueError(f'frozen_stages must be in -1..{NUM_STAGES}, got {frozen_stages}')
        if not isinstance(out_norm, bool):  # a string such as 'False' would be truthy
            raise TypeError(f'out_norm must be True or False, got {out_norm!r}')
        if drop_path_rate is None:
            drop_path_rate = settings['drop_path_rate']

        self.arch_settings = settings
        self.variant = arch.upper() if isinstance(arch, str) else 'custom'
        self.attn_types = attn_types
        self.in_channels = in_channels
        self.embed_dims = tuple(settings['embed_dims'])
        self.out_indices = out_indices
        self.out_norm = out_norm
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims[0], norm_cfg)
        depths = settings['depths']
        drop_rates = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        self.layers = nn.ModuleList()
        for i in range(NUM_STAGES):
            first = sum(depths[:i])
            blocks = nn.ModuleList(
                NaLaBlock(self.embed_dims[i], settings['num_heads'][i], settings['mlp_ratios'][i],
                          mixer_cfgs[i], settings['layer_scale_init_values'][i],
                          drop_rates[first + j], with_cp)
                for j in range(depths[i]))
            downsample = Downsample(self.embed_dims[i], self.embed_dims[i + 1], norm_cfg) \
                if i < NUM_STAGES - 1 else None
            self.layers.append(NaLaStage(blocks, downsample))
        # Per-output norms, named so they cannot collide with the authors' top-level ``norm.*``;
        # parameter-free identities when off, so loading, freezing and forward stay one path.
        for i in out_indices:
            self.add_module(f'out_norm{i}',
                            TokenNorm(self.embed_dims[i]) if out_norm else nn.Identity())
        self._freeze_stages()

    # ------------------------------------------------------------------ init and loading
    def init_weights(self) -> None:
        if self.init_cfg is not None and self.init_cfg.get('type') == 'Pretrained':
            path = self.init_cfg['checkpoint']
            if '://' not in str(path) and not osp.isfile(path):  # local paths only
                raise FileNotFoundError(missing_checkpoint_message(
                    path, self.variant, self._from_scratch_overrides()))
            load_authors_checkpoint(self, path, use_ema=self.init_cfg.get('use_ema', False))
            return
        if self.init_cfg is not None:
            super().init_weights()
            return
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def _from_scratch_overrides(self) -> List[str]:
        """Options that undo what only makes sense on top of pretrained weights: a frozen,
        randomly initialised stem or BN statistics that never leave their initial values."""
        overrides = []
        if self.frozen_stages >= 0:
            overrides.append('model.backbone.frozen_stages=-1')
        if self.norm_eval:
            overrides.append('model.backbone.norm_eval=False')
        return overrides

    def rope_angle_buffers(self) -> List[Tensor]:
        """Per stage, the RoPE frequencies this backbone rebuilds, in the released checkpoints'
        ``layers.{i}.RoPE.angle`` layout (each repeated for its channel pair)."""
        buffers = []
        for stage in self.layers:
            attn = stage.blocks[0].attn
            buffers.append(rope_angle_buffer(attn.head_dims, attn.rope_base))
        return buffers

    def nala_layers_with_kernel(self, kernel: str) -> List[nn.Module]:
        return [m for m in self.modules()
                if isinstance(m, NormAwareLinearAttention) and m.cfg.kernel == kernel]

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

    # ------------------------------------------------------------------ forward
    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        if not isinstance(x, Tensor):
            raise TypeError(f'NaLaFormer expects a Tensor (B, {self.in_channels}, H, W), got '
                            f'{type(x).__name__}')
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'NaLaFormer expects input (B, {self.in_channels}, H, W), got '
                             f'{tuple(x.shape)}')
        # the stem stays channels-first: on CPU its dense convs' backward is ~2x slower in
        # channels-last memory (measured); one copy turns its output into tokens
        x = to_tokens(self.patch_embed(x))
        outs = []
        for i, stage in enumerate(self.layers):
            features, x = stage(x)
            if i in self.out_indices:
                # channels-first and contiguous, as dense heads (and users' .view()) expect
                outs.append(to_map(getattr(self, f'out_norm{i}')(features)).contiguous())
        return tuple(outs)
