"""Token mixers: one gated wrapper with the authors' parameter names, registered mixers inside.

Every mixer shares the released block's wrapper: the ``qkvg`` projection, LePE on v
(``lepe``), LayerNorm (``ln``), the SiLU gate and ``out_proj``. A checkpoint's weights therefore
load into any mixer, every mixer has the same parameters, and comparisons between them are fair.
A mixer defines only :meth:`GatedAttention.mix` on ``(B, heads, N, d)`` tensors (and, for
inspection, :meth:`GatedAttention.attention_weights`). To add one, subclass
:class:`GatedAttention`, register it with :func:`nala_mm.registry.register_model`, and name it in
a backbone's ``mixers`` (``dict(type='MyMixer', ...)``). The contract suite (``tests/contracts``)
finds it in the registry and runs it at each of its :meth:`GatedAttention.contract_variants`.

Modules take and return channels-last tokens ``(B, H, W, C)``, the backbone block's layout: the
projections read contiguous memory, and q, k, v and the gate are four contiguous products with
``qkvg``'s weight rows. The math lives in :mod:`nala_mm.ops`; every mixer takes the package's one
switch, ``mode='fast' | 'reference'`` (:mod:`nala_mm.ops.mode`).
"""
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from einops import rearrange
from mmengine.model import BaseModule
from torch import Tensor, nn

from ..ops import (
    GlobalKeys,
    NaLaConfig,
    Rope,
    apply_rope,
    apply_rope_reference,
    build_plain_feature_map,
    kernelized_attention,
    kernelized_attention_weights,
    resolve_mode,
    rope_phasor,
    rope_table_for,
)
from ..ops.attention.config import KERNELS
from ..ops.attention.feature_maps import PLAIN_FEATURE_MAPS, QUERY_NORMS
from ..ops.token_shard import active_shard
from ..registry import register_model
from .depthwise import TokenConv2d, conv_tokens


def _rope_rows(rope: Rope, rows: Optional[Tensor]) -> Rope:
    """The table's entries of the tokens ``rows`` (all tokens when ``None``)."""
    return rope if rope is None or rows is None else tuple(t[rows] for t in rope)


def token_sequence(x: Tensor, embed_dims: int, hw_shape: Optional[Sequence[int]],
                   num_prefix: int) -> Tuple[Tensor, Tuple[int, int]]:
    """A mixer's input as a token sequence ``(B, num_prefix + H*W, C)`` and its grid ``(H, W)``:
    channels-last tokens ``(B, H, W, C)``, or a sequence with its ``hw_shape``."""
    if x.dim() == 4 and x.shape[-1] == embed_dims and hw_shape is None and num_prefix == 0:
        return x.flatten(1, 2), (x.shape[1], x.shape[2])
    if x.dim() == 3 and x.shape[-1] == embed_dims and hw_shape is not None:
        height, width = hw_shape
        if num_prefix < 0 or x.shape[1] != num_prefix + height * width:
            raise ValueError(f'{x.shape[1]} tokens are not {num_prefix} prefix tokens and '
                             f'the {height}x{width} grid (hw_shape) they came with')
        return x, (height, width)
    raise ValueError(f'expected channels-last tokens (B, H, W, {embed_dims}), or a sequence '
                     f'(B, num_prefix + H*W, {embed_dims}) with its hw_shape; got '
                     f'{tuple(x.shape)} with hw_shape={hw_shape}, num_prefix={num_prefix}')


class GatedAttention(BaseModule):
    """qkvg projection, token mixing (:meth:`mix`), LePE on v, LayerNorm, SiLU gate, out_proj.

    Args:
        embed_dims: channels C.
        num_heads: heads; ``C / num_heads`` must be divisible by 4 when ``use_rope``.
        use_rope: 2D RoPE on the mixing (docs/user_guides/method.md, "2D RoPE").
        rope_base, lepe_kernel_size: as released (10000, 5).
        mode: ``'fast'`` (hand-written backward nodes) or ``'reference'`` (plain ops); see
            :mod:`nala_mm.ops.mode`.
    """
    # Mixers whose math overflows 16-bit formats (NaLa's k^3 and powers) run in float32 under
    # autocast; the others keep the autocast dtype.
    mix_in_float32 = True
    # Whether the rows of :meth:`attention_weights` *with* RoPE are distributions (non-negative,
    # summing to 1): the attention statistics take entropies of such rows only.
    rope_rows_are_distributions = True

    def __init__(self, embed_dims: int, num_heads: int, use_rope: bool = True,
                 rope_base: float = 10000.0, lepe_kernel_size: int = 5, mode: str = 'fast',
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        resolve_mode(mode)  # validates
        self.mode = mode
        if embed_dims <= 0 or num_heads <= 0 or embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims must be a positive multiple of num_heads, got '
                             f'embed_dims={embed_dims}, num_heads={num_heads}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        if use_rope and self.head_dims % 4 != 0:
            raise ValueError(f'2D RoPE needs a head dim divisible by 4, got head_dim='
                             f'{self.head_dims} (embed_dims={embed_dims}, num_heads={num_heads})')
        if not isinstance(use_rope, bool):
            raise TypeError(f'use_rope must be True or False, got {use_rope!r}')
        self.use_rope = use_rope
        self.rope_base = rope_base
        self.qkvg = nn.Linear(embed_dims, 4 * embed_dims)
        self.lepe = TokenConv2d(embed_dims, embed_dims, lepe_kernel_size,
                                padding=lepe_kernel_size // 2, groups=embed_dims, mode=mode)
        self.ln = nn.LayerNorm(embed_dims, eps=1e-5)
        self.out_proj = nn.Linear(embed_dims, embed_dims)

    # ------------------------------------------------------------------ what a mixer defines
    def mix(self, q: Tensor, k: Tensor, v: Tensor, rope: Rope) -> Tensor:
        """``(B, heads, N, d)`` queries, keys, values -> mixed values of the same shape."""
        raise NotImplementedError

    def attention_weights(self, q: Tensor, k: Tensor, rope: Rope,
                          rows: Optional[Tensor] = None) -> Tensor:
        """The weights ``(B, heads, len(rows), N)`` with which the queries ``rows`` (all when
        ``None``) mix the values, for inspection. Quadratic in N without ``rows``."""
        raise NotImplementedError

    @classmethod
    def contract_variants(cls) -> Dict[str, dict]:
        """The settings of this mixer that the contract suite (``tests/contracts``) runs, each
        a config without sizes (``dict(type=..., **variant)``) under an id: every branch of the
        mixer's math that a setting selects. Default: the mixer's own defaults. A subclass whose
        arguments choose among code paths overrides it."""
        return {'default': {}}

    # ------------------------------------------------------------------ what the analysis asks
    def query_exponent(self, qnorm: Tensor) -> Optional[Tensor]:
        """The exponent this mixer gives queries of norm ``qnorm`` (per head), or ``None`` when
        it has no query exponent (NaLa's is ``p(||q||)``, docs/user_guides/method.md)."""
        return None

    def exponent_ceiling(self) -> Optional[float]:
        """The supremum of a norm-dependent query exponent; ``None`` when there is none."""
        return None

    def query_norm_at_exponent(self, power: float) -> Optional[float]:
        """The query norm from which the exponent reaches ``power``; ``None`` without a
        norm-dependent exponent."""
        return None

    # ------------------------------------------------------------------ shared wrapper
    def _mix(self, q: Tensor, k: Tensor, v: Tensor, rope: Rope, grid: Tuple[int, int],
             num_prefix: int) -> Tensor:
        """:meth:`mix` in the forward, which knows the grid: a mixer that can attend over an
        image whose rows are split across ranks (:mod:`nala_mm.parallel`) uses it."""
        return self.mix(q, k, v, rope)

    def _tokens(self, x: Tensor, hw_shape: Optional[Sequence[int]],
                num_prefix: int) -> Tuple[Tensor, Tuple[int, int]]:
        return token_sequence(x, self.embed_dims, hw_shape, num_prefix)

    def _heads(self, t: Tensor) -> Tensor:
        return rearrange(t, 'b l (n d) -> b n l d', n=self.num_heads)

    def project(self, x: Tensor, hw_shape: Optional[Sequence[int]] = None, num_prefix: int = 0
                ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Rope]:
        """The input (as :meth:`forward` takes it) -> q, k, v as ``(B, heads, L, d)`` over its
        ``L`` tokens (prefix first), the gate ``(B, L, C)`` and the RoPE table of the ``L``
        tokens (``None`` without RoPE)."""
        tokens, grid = self._tokens(x, hw_shape, num_prefix)
        q, k, v, _, gate, rope = self._split(tokens, grid, num_prefix)
        return q, k, v, gate, rope

    def _split(self, tokens: Tensor, grid: Tuple[int, int], num_prefix: int):
        """:meth:`project` plus v as tokens ``(B, L, C)`` (LePE's input)."""
        # Four products with qkvg's weight rows rather than one 4C-wide output chunked: each
        # result is contiguous (the mixing and LePE read dense memory), and the backward sums
        # four C-wide input gradients instead of concatenating a 4C-wide one (measured: the
        # layer's peak training memory drops by that concatenation).
        q, k, v_tokens, gate = (F.linear(tokens, weight, bias) for weight, bias in
                                zip(self.qkvg.weight.chunk(4), self.qkvg.bias.chunk(4)))
        # a stripe of an image split across ranks rotates by its global rows
        shard = active_shard()
        first_row = 0 if shard is None else shard.grid_rows(self)[0]
        rope = None if not self.use_rope else rope_table_for(
            *grid, self.head_dims, self.rope_base, tokens.device, self.mode, num_prefix,
            first_row)
        return self._heads(q), self._heads(k), self._heads(v_tokens), v_tokens, gate, rope

    def forward(self, x: Tensor, hw_shape: Optional[Sequence[int]] = None,
                num_prefix: int = 0) -> Tensor:
        """Channels-last tokens ``(B, H, W, C)`` -> the same shape; or a token sequence
        ``(B, num_prefix + H*W, C)`` with its grid ``hw_shape`` -> the same shape.

        The ``num_prefix`` leading tokens have no grid position (a ViT's class token): they
        attend to every token and every token attends to them, but they take no part in LePE
        (its output is zero there) and RoPE leaves them unrotated (identity rows), as RoPE
        ViTs treat the class token.
        """
        tokens, grid = self._tokens(x, hw_shape, num_prefix)
        q, k, v, v_tokens, gate, rope = self._split(tokens, grid, num_prefix)
        if self.mix_in_float32:
            # k^3 and the per-token power overflow fp16/bf16: float32 even under autocast
            with torch.autocast(device_type=x.device.type, enabled=False):
                mixed = self._mix(q.float(), k.float(), v.float(), rope, grid, num_prefix)
        else:
            mixed = self._mix(q, k, v, rope, grid, num_prefix)
        # a view when the mixer wrote its output token-major (the fast kernelised op does)
        mixed = rearrange(mixed, 'b n l d -> b l (n d)').to(gate.dtype)
        # reassigned rather than named, so that each intermediate is freed as soon as it is used
        # into LePE's output, which nothing else holds (its backward does not need it)
        lepe = conv_tokens(self.lepe, v_tokens[:, num_prefix:].unflatten(1, grid)).flatten(1, 2)
        if num_prefix:
            lepe = torch.cat([lepe.new_zeros(lepe.shape[0], num_prefix, lepe.shape[2]), lepe], 1)
        mixed = lepe.add_(mixed)
        del q, k, v, v_tokens, lepe
        out = self.out_proj(self.ln(mixed) * F.silu(gate))
        return out if x.dim() == 3 else out.view(x.shape)


class KernelizedMixer(GatedAttention):
    """A linear-cost mixer: two feature maps (:class:`nala_mm.ops.FeatureMap`) and
    :func:`nala_mm.ops.kernelized_attention`. A new kernelised mixer is a subclass that passes
    its maps; the fast op, the FLOP counter and the attention statistics need nothing else."""
    # phi(q) . phi(k) rows are distributions only without RoPE (with it they can go negative)
    rope_rows_are_distributions = False

    def __init__(self, embed_dims: int, num_heads: int, query_map, key_map, eps: float,
                 **kwargs):
        super().__init__(embed_dims, num_heads, **kwargs)
        self.query_map, self.key_map, self.eps = query_map, key_map, eps

    def mix(self, q, k, v, rope):
        return kernelized_attention(q, k, v, self.query_map, self.key_map, self.eps, rope,
                                    self.mode)

    def _mix(self, q, k, v, rope, grid, num_prefix):
        shard = active_shard()
        if shard is None:
            return self.mix(q, k, v, rope)
        # every rank's grid rows and the prefix tokens (counted by one rank) are the keys
        keys = GlobalKeys(total=num_prefix + shard.grid_rows(self)[1] * grid[1],
                          skip=0 if shard.holds_prefix_keys else num_prefix,
                          reduce_sum=shard.reduce_sum)
        return kernelized_attention(q, k, v, self.query_map, self.key_map, self.eps, rope,
                                    self.mode, global_keys=keys)

    def attention_weights(self, q, k, rope, rows=None):
        queries = q if rows is None else q[..., rows, :]
        return kernelized_attention_weights(queries, k, self.query_map, self.key_map, self.eps,
                                            _rope_rows(rope, rows), rope)


@register_model
class NormAwareLinearAttention(KernelizedMixer):
    """NaLa: norm-aware linear attention (docs/user_guides/method.md), linear in the number of
    tokens.

    Args:
        embed_dims, num_heads, use_rope: see :class:`GatedAttention`.
        kernel: ``'cosine'`` (paper, cosine inhibit), ``'relu'`` (released code, hard split) or
            ``'positive'`` (ablation: positive part only, signed interactions discarded).
        alpha, lam, tau, eps: see :class:`nala_mm.ops.NaLaConfig`.
        norm_aware: ``False`` fixes the query exponent at ``fixed_power`` (ablation: the output
            then no longer depends on the query norm).
        query_norm: ``'raw'`` (paper): the exponent reads ``tanh ||q||``; ``'rms'``: it reads
            ``tanh(||q|| / sqrt(d))``, which stays responsive at larger query norms.
        mode: see :class:`GatedAttention`.
    """

    def __init__(self, embed_dims: int, num_heads: int, kernel: str = 'cosine',
                 alpha: float = 20.0, lam: float = 3.0, tau: float = 0.5, eps: float = 1e-6,
                 norm_aware: bool = True, fixed_power: float = 3.0, query_norm: str = 'raw',
                 **kwargs):
        cfg = NaLaConfig(kernel=kernel, alpha=alpha, lam=lam, tau=tau, eps=eps,
                         norm_aware=norm_aware, fixed_power=fixed_power, query_norm=query_norm)
        super().__init__(embed_dims, num_heads, *cfg.feature_maps(), eps, **kwargs)
        self.cfg = cfg

    @classmethod
    def contract_variants(cls) -> Dict[str, dict]:
        """Every kernel with every query norm (``'cosine-raw'``, ...): each pair is its own
        feature-map code."""
        return {f'{kernel}-{norm}': dict(kernel=kernel, query_norm=norm)
                for kernel in KERNELS for norm in QUERY_NORMS}

    def query_exponent(self, qnorm: Tensor) -> Tensor:
        return self.query_map.power(qnorm, self.head_dims)

    def exponent_ceiling(self) -> Optional[float]:
        return self.cfg.lam * (self.cfg.tau + 1.0) if self.cfg.norm_aware else None

    def query_norm_at_exponent(self, power: float) -> Optional[float]:
        if not self.cfg.norm_aware:
            return None
        return self.query_map.norm_at_power(power, self.head_dims)

    def extra_repr(self) -> str:
        return f'heads={self.num_heads}, {self.cfg}, rope={self.use_rope}, mode={self.mode}'


@register_model
class LinearAttention(KernelizedMixer):
    """Plain kernelised linear attention, the baseline NaLa is measured against.

    ``feature_map='relu'`` is positively homogeneous: scaling a query scales its numerator and
    normaliser alike, so the output cannot depend on the query norm (the failure the paper starts
    from). ``'elu'`` is the other classic, ``1 + elu(x)``. RoPE on the numerator as NaLa does;
    the same fast, memory-light op as NaLa.
    """

    def __init__(self, embed_dims: int, num_heads: int, feature_map: str = 'relu',
                 eps: float = 1e-6, **kwargs):
        phi = build_plain_feature_map(feature_map)
        super().__init__(embed_dims, num_heads, phi, phi, eps, **kwargs)
        self.feature_map = feature_map

    @classmethod
    def contract_variants(cls) -> Dict[str, dict]:
        """Every plain feature map (``'relu'``, ``'elu'``)."""
        return {name: dict(feature_map=name) for name in PLAIN_FEATURE_MAPS}

    def extra_repr(self) -> str:
        return (f'heads={self.num_heads}, feature_map={self.feature_map}, eps={self.eps:g}, '
                f'rope={self.use_rope}, mode={self.mode}')


@register_model
class SoftmaxAttention(GatedAttention):
    """Full softmax attention on RoPE'd q, k (the released 'v' stages), through SDPA.

    ``scaled_dot_product_attention`` picks a memory-efficient / flash kernel where the device
    has one, so the N x N matrix is not stored on GPU.
    """

    # SDPA's fused fp16/bf16 kernels need q, k, v in the autocast dtype: no float32 cast.
    mix_in_float32 = False

    def _rotate(self, q: Tensor, k: Tensor, rope: Rope, rows: Optional[Tensor] = None):
        if rope is None:
            return q, k
        query_rope = _rope_rows(rope, rows)
        if q.dtype != torch.float32 or resolve_mode(self.mode) == 'reference':
            # ONNX has no complex numbers and bf16 has no complex type: the real form, in the
            # inputs' dtype so that the attention stays in it
            query_rope, rope = ([t.to(q.dtype) for t in table] for table in (query_rope, rope))
            return apply_rope_reference(q, *query_rope), apply_rope_reference(k, *rope)
        return apply_rope(q, rope_phasor(*query_rope)), apply_rope(k, rope_phasor(*rope))

    def mix(self, q, k, v, rope):
        q, k = self._rotate(q, k, rope)
        return F.scaled_dot_product_attention(q, k, v)

    def attention_weights(self, q, k, rope, rows=None):
        queries = q if rows is None else q[..., rows, :]
        queries, k = self._rotate(queries, k, rope, rows)
        return torch.softmax(queries @ k.transpose(-1, -2) * self.head_dims ** -0.5, dim=-1)


@register_model
class IdentityAttention(GatedAttention):
    """The control that mixes no tokens: every query attends to itself alone (``A = I``).

    Same wrapper and parameters as every other mixer (qkvg, LePE, gated norm, out_proj), so a
    comparison against it measures what the token mixing adds beyond the block's convolutions;
    q and k are computed and ignored. Information still moves between neighbours through LePE's
    5x5 window and the block's depthwise convs, never further per layer.
    """

    mix_in_float32 = False

    def mix(self, q, k, v, rope):
        return v

    def attention_weights(self, q, k, rope, rows=None):
        n_tokens = k.shape[-2]
        queries = torch.arange(n_tokens, device=k.device) if rows is None else rows
        eye = F.one_hot(queries, n_tokens).to(k.dtype)
        return eye.expand(*k.shape[:-2], len(queries), n_tokens)
