"""An independent transcription of the released NaLaFormer (spec §1-3), for parity tests.

Its own 2D RoPE (the released frequencies ``1 / 10000 ** linspace(0, 1, d/4)``, stored per pair
as ``RoPE.angle``, sin/cos tables d wide with each angle repeated for its pair), its own softmax
attention, the authors' module names and the classification tail; its NaLa is the released op
sequence of :mod:`tests.reference.released_op` (k cubed, ReLU split, the query direction raised to
``3 (0.5 + tanh ||q||)``, the two feature halves rotated separately, k and v scaled by
``N^-1/2``), which imports nothing from the rest of ``nala_mm``. A checkpoint written from this
model has exactly the released layout, ``RoPE.angle`` buffers included.
"""
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tests.reference.released_op import nala_attention_released


def released_frequencies(head_dim: int) -> Tensor:
    return 1.0 / 10000 ** torch.linspace(0, 1, head_dim // 4)


class RoPE(nn.Module):

    def __init__(self, head_dim: int):
        super().__init__()
        # each frequency once per channel pair: (f0, f0, f1, f1, ...), d/2 entries
        self.register_buffer('angle', released_frequencies(head_dim).repeat_interleave(2))

    def forward(self, height: int, width: int) -> Tuple[Tensor, Tensor]:
        """sin and cos tables (H*W, d): the first d/2 channels follow the row, the rest the
        column."""
        rows = torch.arange(height, dtype=self.angle.dtype)[:, None] * self.angle
        cols = torch.arange(width, dtype=self.angle.dtype)[:, None] * self.angle
        grid = torch.cat([rows[:, None, :].repeat(1, width, 1),
                          cols[None, :, :].repeat(height, 1, 1)], dim=-1)
        grid = grid.reshape(height * width, -1)
        return grid.sin(), grid.cos()


def rotate(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    pairs = x.unflatten(-1, (-1, 2))
    turned = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x * cos + turned * sin


def released_nala(q: Tensor, k: Tensor, v: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """(B, heads, N, d) in float32, the released op sequence, with this model's d-wide tables
    (each angle twice, once per channel of its pair: one column per pair is the op's table)."""
    return nala_attention_released(q, k, v, rope=(cos[..., 0::2], sin[..., 0::2]))


def released_softmax(q: Tensor, k: Tensor, v: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    q, k = rotate(q, sin, cos), rotate(k, sin, cos)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(scores, dim=-1) @ v


class Attention(nn.Module):
    """Either mixer of the released code: qkvg, LePE on v, LayerNorm, SiLU gate, out_proj."""

    def __init__(self, dim: int, heads: int, mixer):
        super().__init__()
        self.heads, self.mixer = heads, mixer
        self.qkvg = nn.Linear(dim, 4 * dim)
        self.lepe = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.out_proj = nn.Linear(dim, dim)
        self.ln = nn.LayerNorm(dim)

    def forward(self, x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
        b, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)  # (B, N, C)
        q, k, v, g = self.qkvg(tokens).unflatten(-1, (4, c)).unbind(dim=-2)
        lepe = self.lepe(v.transpose(1, 2).reshape(b, c, h, w)).flatten(2).transpose(1, 2)

        def split_heads(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2).float()

        mixed = self.mixer(split_heads(q), split_heads(k), split_heads(v), sin, cos)
        mixed = mixed.transpose(1, 2).reshape(b, h * w, c)
        out = self.out_proj(self.ln(mixed + lepe) * F.silu(g))
        return out.transpose(1, 2).reshape(b, c, h, w)


class ChannelLayerNorm(nn.Module):

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class FeedForward(nn.Module):

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        hidden = F.gelu(self.fc1(x.flatten(2).transpose(1, 2)))
        hidden = hidden.transpose(1, 2).reshape(b, -1, h, w)
        hidden = hidden + self.dwconv(hidden)
        out = self.fc2(hidden.flatten(2).transpose(1, 2))
        return out.transpose(1, 2).reshape(b, c, h, w)


class Block(nn.Module):

    def __init__(self, dim: int, heads: int, hidden: int, mixer, layer_scale: float):
        super().__init__()
        self.cpe1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.cpe2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm1, self.norm2 = ChannelLayerNorm(dim), ChannelLayerNorm(dim)
        self.attn = Attention(dim, heads, mixer)
        self.ffn = FeedForward(dim, hidden)
        self.gamma_1 = nn.Parameter(torch.full((1, dim, 1, 1), layer_scale))
        self.gamma_2 = nn.Parameter(torch.full((1, dim, 1, 1), layer_scale))

    def forward(self, x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
        x = x + self.cpe1(x)
        x = x + self.gamma_1 * self.attn(self.norm1(x), sin, cos)
        x = x + self.cpe2(x)
        return x + self.gamma_2 * self.ffn(self.norm2(x))


class Downsample(nn.Module):

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = nn.BatchNorm2d(out_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.reduction(x))


class Stage(nn.Module):

    def __init__(self, dim: int, out_dim, depth: int, heads: int, hidden: int, mixer,
                 layer_scale: float):
        super().__init__()
        self.RoPE = RoPE(dim // heads)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, mixer, layer_scale)
                                    for _ in range(depth))
        self.downsample = Downsample(dim, out_dim) if out_dim else None


MIXERS = {'l': released_nala, 'v': released_softmax}


class ReleasedNaLaFormer(nn.Module):
    """The released classifier; ``stage_features`` returns each stage's output before its
    downsample (what a dense backbone hands to its neck)."""

    def __init__(self, dims: Sequence[int], depths: Sequence[int], heads: Sequence[int],
                 mlp_ratio: float, flags: str = 'llvv', layer_scales=(1.0,) * 4,
                 num_classes: int = 10):
        super().__init__()
        half = dims[0] // 2
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Sequential(
            nn.Conv2d(3, half, 3, 2, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, dims[0], 3, 2, 1), nn.BatchNorm2d(dims[0]))
        self.layers = nn.ModuleList(
            Stage(dims[i], dims[i + 1] if i < 3 else None, depths[i], heads[i],
                  int(mlp_ratio * dims[i]), MIXERS[flags[i]], layer_scales[i])
            for i in range(4))
        self.proj = nn.Linear(dims[3], 1024)
        self.norm = nn.BatchNorm2d(1024)
        self.head = nn.Conv2d(1024, num_classes, 1)

    def stage_features(self, x: Tensor) -> List[Tensor]:
        x = self.patch_embed.proj(x)
        features = []
        for stage in self.layers:
            sin, cos = stage.RoPE(*x.shape[-2:])
            for block in stage.blocks:
                x = block(x, sin, cos)
            features.append(x)
            if stage.downsample is not None:
                x = stage.downsample(x)
        return features

    def forward(self, x: Tensor) -> Tensor:
        """The released classifier's logits: every stage-4 token projected to 1024 channels,
        BatchNorm over the projected map, Swish, global average pooling, the 1x1-conv head."""
        x = self.stage_features(x)[-1]
        b, _, h, w = x.shape
        x = self.proj(x.flatten(2).transpose(1, 2))  # (B, N, 1024)
        x = self.norm(x.transpose(1, 2).reshape(b, -1, h, w))
        x = F.adaptive_avg_pool2d(x * torch.sigmoid(x), 1)
        return self.head(x).flatten(1)

    def randomise_statistics(self, seed: int = 0) -> 'ReleasedNaLaFormer':
        """Non-trivial BN statistics and LayerScale, so a tensor that fails to load changes the
        output (fresh BN statistics and unit LayerScale would hide it)."""
        gen = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(torch.rand(module.num_features, generator=gen) - 0.5)
                module.running_var.copy_(torch.rand(module.num_features, generator=gen) * 1.5
                                         + 0.5)
        for name, param in self.named_parameters():
            if name.endswith(('gamma_1', 'gamma_2')):
                param.data.copy_(torch.rand(param.shape, generator=gen) + 0.5)
        return self


# The authors' variants (spec §2, docs/user_guides/method.md's table, both transcribed from the
# released
# code): per-stage embed dims, depths and heads, one MLP ratio, per-stage LayerScale init, and
# the stochastic-depth rate of ImageNet training.
VARIANTS = {
    'xt': dict(dims=(32, 64, 128, 384), depths=(2, 2, 2, 2), heads=(1, 2, 4, 12),
               mlp_ratio=3.5, layer_scales=(1.0, 1.0, 1.0, 1.0), drop_path=0.10),
    't': dict(dims=(64, 128, 256, 512), depths=(2, 2, 6, 2), heads=(1, 2, 4, 8),
              mlp_ratio=4.0, layer_scales=(1.0, 1.0, 1.0, 1.0), drop_path=0.10),
    's': dict(dims=(64, 128, 320, 512), depths=(3, 5, 9, 3), heads=(1, 2, 5, 8),
              mlp_ratio=3.5, layer_scales=(1.0, 1.0, 1.0, 1.0), drop_path=0.15),
    'b': dict(dims=(96, 192, 384, 512), depths=(4, 6, 12, 6), heads=(1, 2, 6, 8),
              mlp_ratio=4.0, layer_scales=(1.0, 1.0, 1e-6, 1e-6), drop_path=0.40),
    'l': dict(dims=(96, 192, 448, 640), depths=(4, 7, 19, 8), heads=(1, 2, 7, 10),
              mlp_ratio=3.5, layer_scales=(1e-6, 1e-6, 1e-6, 1e-6), drop_path=0.55),
}
# The classification tail's top-level modules: not part of a dense backbone.
CLASSIFICATION_TAIL = ('proj.', 'norm.', 'head.')


def released_variant(name: str, flags: str = 'llvv', num_classes: int = 1000) -> ReleasedNaLaFormer:
    """The released classifier of a named variant (ImageNet-1K head by default)."""
    v = VARIANTS[name]
    return ReleasedNaLaFormer(v['dims'], v['depths'], v['heads'], v['mlp_ratio'], flags,
                              v['layer_scales'], num_classes)
