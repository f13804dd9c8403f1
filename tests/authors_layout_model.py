"""An independent model in the authors' module layout (spec §2-3), for checkpoint-parity tests.

Written from the spec without nala_mm's modules (only the released-order attention op), with
the classification tail and the ``RoPE.angle`` buffers a real checkpoint carries.
"""
import torch
import torch.nn.functional as F
from torch import nn

from nala_mm.ops.nala_released import nala_attention_released
from nala_mm.ops.rope2d import rope_angles


class RoPE(nn.Module):

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        quarter = head_dim // 4
        self.register_buffer('angle', 1.0 / base ** (torch.arange(quarter) / quarter))

    def forward(self, height, width):
        angles = rope_angles(height, width, self.angle)
        return angles.cos(), angles.sin()


class Attention(nn.Module):

    def __init__(self, dim, heads, softmax):
        super().__init__()
        self.heads, self.softmax = heads, softmax
        self.qkvg = nn.Linear(dim, 4 * dim)
        self.lepe = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.ln = nn.LayerNorm(dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x, rope):  # x: (B, H, W, C)
        b, h, w, c = x.shape
        q, k, v, g = self.qkvg(x).chunk(4, dim=-1)

        def heads(t):
            return t.reshape(b, h * w, self.heads, c // self.heads).transpose(1, 2)

        if self.softmax:
            from nala_mm.ops.rope2d import apply_rope_reference
            qh, kh = apply_rope_reference(heads(q), *rope), apply_rope_reference(heads(k), *rope)
            attn = torch.softmax(qh @ kh.transpose(-1, -2) * (c // self.heads) ** -0.5, dim=-1)
            out = attn @ heads(v)
        else:
            out = nala_attention_released(heads(q), heads(k), heads(v), rope=rope)
        out = out.transpose(1, 2).reshape(b, h, w, c)
        lepe = self.lepe(v.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.out_proj(self.ln(out + lepe) * F.silu(g))


class ChannelNorm(nn.Module):

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class FFN(nn.Module):

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)

    def forward(self, x):
        h = F.gelu(self.fc1(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        h = h + self.dwconv(h)
        return self.fc2(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Block(nn.Module):

    def __init__(self, dim, heads, ratio, softmax, ls):
        super().__init__()
        self.cpe1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.cpe2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm1, self.norm2 = ChannelNorm(dim), ChannelNorm(dim)
        self.attn = Attention(dim, heads, softmax)
        self.ffn = FFN(dim, int(dim * ratio))
        self.gamma_1 = nn.Parameter(ls * torch.ones(1, dim, 1, 1))
        self.gamma_2 = nn.Parameter(ls * torch.ones(1, dim, 1, 1))

    def forward(self, x, rope):
        x = x + self.cpe1(x)
        x = x + self.gamma_1 * self.attn(self.norm1(x).permute(0, 2, 3, 1), rope).permute(0, 3, 1, 2)
        x = x + self.cpe2(x)
        return x + self.gamma_2 * self.ffn(self.norm2(x))


class Downsample(nn.Module):

    def __init__(self, cin, cout):
        super().__init__()
        self.reduction = nn.Conv2d(cin, cout, 3, 2, 1)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.norm(self.reduction(x))


class Layer(nn.Module):

    def __init__(self, dim, next_dim, depth, heads, ratio, softmax, ls):
        super().__init__()
        self.RoPE = RoPE(dim // heads)
        self.blocks = nn.ModuleList(Block(dim, heads, ratio, softmax, ls) for _ in range(depth))
        self.downsample = Downsample(dim, next_dim) if next_dim else None


class AuthorsNaLaFormer(nn.Module):
    """Classification model in the authors' layout; ``stage_features`` gives the dense outputs."""

    def __init__(self, dims, depths, heads, ratio, softmax_stages=(2, 3), num_classes=10):
        super().__init__()
        half = dims[0] // 2
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Sequential(
            nn.Conv2d(3, half, 3, 2, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, dims[0], 3, 2, 1), nn.BatchNorm2d(dims[0]))
        self.layers = nn.ModuleList(
            Layer(dims[i], dims[i + 1] if i < 3 else None, depths[i], heads[i], ratio,
                  i in softmax_stages, 1.0) for i in range(4))
        self.proj = nn.Linear(dims[3], 1024)
        self.norm = nn.BatchNorm2d(1024)
        self.head = nn.Conv2d(1024, num_classes, 1)

    def stage_features(self, x):
        x = self.patch_embed.proj(x)
        outs = []
        for layer in self.layers:
            rope = layer.RoPE(*x.shape[-2:])
            for block in layer.blocks:
                x = block(x, rope)
            outs.append(x)
            if layer.downsample is not None:
                x = layer.downsample(x)
        return outs
