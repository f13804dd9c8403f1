"""What the attention layers of a backbone do on one input: the statistics behind the paper's
Figure 1 (a larger query norm gives a sharper attention row) for every
:class:`~nala_mm.models.GatedAttention` of a model. ``tools/analyze_attention.py`` draws them
(docs/mixers.md, 'Looking at the attention').

Per layer (:func:`layer_statistics`, from the layer's input and :meth:`GatedAttention.project`):

* **Entropy vs query norm.** For every query token and head: the Shannon entropy (nats) of its
  attention row and ``||q||`` of that head's query vector, pooled over heads and tokens, and
  their Spearman rank correlation (:attr:`LayerStats.spearman`; each head's own in
  :meth:`LayerStats.summary`, since heads whose norms differ can dominate the pooled value).
  Which rows (:func:`entropy_rope`): for the kernelised mixers (NaLa, plain linear attention)
  the rows *without* RoPE, which are distributions (non-negative, sum 1; with RoPE they can go
  negative and have no entropy); for softmax attention the rows *with* RoPE (still
  distributions). Rows are computed :data:`ROW_CHUNK` queries at a time, so no N x N matrix
  exists; above :data:`MAX_FULL_TOKENS` tokens the entropies come from a fixed (seeded) sample
  of :data:`SAMPLED_QUERIES` queries.
* **Attention rows of chosen queries** (pixels of the network input): the row *with* RoPE (the
  weights that mix the values), averaged over heads, on the layer's token grid. Kernelised rows
  with RoPE may be signed.
* **NaLa's exponent** ``p = lam (tau + tanh ||q||)``: the share of (head, query) pairs within
  1 % of its ceiling ``lam (tau + 1)`` (:func:`saturated_share`); see docs/method.md, 'Query
  norm x direction'.
"""
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from ..models import GatedAttention, LinearAttention, NormAwareLinearAttention
from ..ops import Rope

Point = Tuple[float, float]  # (x, y) in pixels
Size = Tuple[int, int]  # (height, width)

ROW_CHUNK = 256  # query rows per attention_weights call: ROW_CHUNK x N weights at a time
MAX_FULL_TOKENS = 8192  # above this, entropies come from a sample of queries
SAMPLED_QUERIES = 4096
SAMPLE_SEED = 0
SATURATION = 0.99  # "saturated": exponent >= 99 % of its ceiling
# Kernelised rows without RoPE and softmax rows are non-negative up to rounding; anything more
# negative means the rows are not distributions (e.g. RoPE was applied to a kernelised row).
NEGATIVE_TOLERANCE = 1e-6
# Mixers whose rows are ``phi(q) . phi(k)`` products: distributions only without RoPE.
KERNELIZED_MIXERS = (NormAwareLinearAttention, LinearAttention)


# ------------------------------------------------------------------------------ statistics
def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of a 1-D array; tied values share the mean of the ranks they span."""
    _, group, counts = np.unique(np.asarray(values, dtype=np.float64).ravel(),
                                 return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # group g spans ranks ends[g]-counts[g]+1 .. ends[g]
    return (ends - (counts - 1) / 2.0)[group.ravel()]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (Pearson's on average ranks); NaN if either side is constant."""
    x, y = np.asarray(x).ravel(), np.asarray(y).ravel()
    if x.shape != y.shape:
        raise ValueError(f'spearman needs two samples of one length, got {x.size} and {y.size}')
    rank_x = average_ranks(x) - (x.size + 1) / 2.0  # mean rank is (n + 1) / 2, ties or not
    rank_y = average_ranks(y) - (y.size + 1) / 2.0
    scale = math.sqrt(float(rank_x @ rank_x) * float(rank_y @ rank_y))
    if scale == 0.0:
        return float('nan')
    return float(np.clip(rank_x @ rank_y / scale, -1.0, 1.0))


def row_entropy(weights: Tensor) -> Tensor:
    """Shannon entropy (nats) of each row (last dim) of non-negative attention weights.

    Negative rounding is clamped to 0 and rows are renormalised (NaLa's ``eps`` leaves their sums
    a hair under 1); a row that is not a distribution is refused.
    """
    lowest = weights.min().item()
    if lowest < -NEGATIVE_TOLERANCE:
        raise ValueError(f'attention rows have weights down to {lowest:.3g}; entropy needs '
                         f'non-negative rows (kernelised rows must be taken without RoPE)')
    probs = weights.clamp_min(0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return -torch.xlogy(probs, probs).sum(dim=-1)


def entropy_rope(layer: GatedAttention, rope: Rope) -> Tuple[Rope, str]:
    """The RoPE table to take entropy rows with, and its label (``LayerStats.entropy_rows``):
    none for kernelised mixers, whose rows with RoPE are not distributions."""
    if isinstance(layer, KERNELIZED_MIXERS) or rope is None:
        return None, 'without RoPE'
    return rope, 'with RoPE'


def query_entropies(layer: GatedAttention, q: Tensor, k: Tensor, rope: Rope,
                    rows: Optional[Tensor] = None, chunk: int = ROW_CHUNK) -> Tensor:
    """Entropies ``(B, heads, len(rows))`` of the attention rows of the queries ``rows`` (all
    when ``None``), ``chunk`` rows at a time so that at most ``chunk x N`` weights exist."""
    if rows is None:
        rows = torch.arange(q.shape[-2], device=q.device)
    return torch.cat([row_entropy(layer.attention_weights(q, k, rope, rows[i:i + chunk]))
                      for i in range(0, len(rows), chunk)], dim=-1)


def exponent_ceiling(layer: NormAwareLinearAttention) -> float:
    """The supremum ``lam (tau + 1)`` of NaLa's query exponent."""
    return layer.cfg.lam * (layer.cfg.tau + 1.0)


def saturated_share(layer: NormAwareLinearAttention, qnorm: Tensor) -> Optional[float]:
    """Share of queries whose exponent ``lam (tau + tanh ||q||)`` is >= 99 % of its ceiling;
    ``None`` when the layer is not norm-aware (its exponent is fixed)."""
    cfg = layer.cfg
    if not cfg.norm_aware:
        return None
    power = cfg.lam * (cfg.tau + torch.tanh(qnorm))
    return float((power >= SATURATION * exponent_ceiling(layer)).double().mean())


def saturation_norm(layer: NormAwareLinearAttention) -> float:
    """The query norm from which the exponent is >= 99 % of its ceiling:
    ``tanh ||q|| >= 0.99 (tau + 1) - tau``."""
    bound = SATURATION * (layer.cfg.tau + 1.0) - layer.cfg.tau
    return math.atanh(max(bound, 0.0))  # bound < 0 (tau > 99): every query is saturated


def query_token(point: Point, input_size: Size, grid: Size) -> Tuple[int, int]:
    """Pixel ``(x, y)`` of the network input -> ``(row, col)`` on a layer's ``h x w`` grid."""
    (x, y), (height, width), (rows, cols) = point, input_size, grid
    return min(math.floor(y * rows / height), rows - 1), min(math.floor(x * cols / width), cols - 1)


def json_number(value: float) -> Optional[float]:
    """NaN (no correlation defined) -> ``None``: JSON has no NaN."""
    return None if math.isnan(value) else value


@dataclass
class LayerStats:
    """What :func:`layer_statistics` measured on one layer (arrays are for the plots)."""
    mixer: str
    heads: int
    grid: Size
    entropy: np.ndarray  # per (head, entropy query), pooled
    entropy_qnorm: np.ndarray  # ||q|| of the same (head, query) pairs
    qnorm: np.ndarray  # ||q|| of every (head, query)
    entropy_rows: str
    entropy_sampled: bool
    query_tokens: List[Tuple[int, int]] = field(default_factory=list)
    maps: List[np.ndarray] = field(default_factory=list)  # (h, w) per point, mean over heads
    norm_aware: Optional[bool] = None  # NaLa layers only, from here down
    saturated_share: Optional[float] = None
    exponent: Optional[float] = None  # ceiling when norm-aware, else the fixed exponent
    saturation_norm: Optional[float] = None  # ||q|| from which the exponent counts as saturated

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def spearman(self) -> float:
        return spearman(self.entropy, self.entropy_qnorm)

    def summary(self, name: str, stage: Optional[int]) -> dict:
        """This layer's entry of ``attention_stats.json``."""
        entry = dict(layer=name, mixer=self.mixer, stage=stage, tokens=self.tokens,
                     grid=list(self.grid), heads=self.heads,
                     spearman_entropy_vs_qnorm=json_number(self.spearman),
                     # pooling mixes heads whose norms differ: each head's own correlation
                     spearman_per_head=[json_number(spearman(e, n)) for e, n in zip(
                         self.entropy.reshape(self.heads, -1),
                         self.entropy_qnorm.reshape(self.heads, -1))],
                     entropy_rows=self.entropy_rows,
                     entropy_queries=self.entropy.size // self.heads,
                     entropy_queries_sampled=self.entropy_sampled,
                     entropy_mean=float(self.entropy.mean()),
                     qnorm_mean=float(self.qnorm.mean()),
                     qnorm_p5=float(np.percentile(self.qnorm, 5)),
                     qnorm_p95=float(np.percentile(self.qnorm, 95)),
                     query_tokens=[list(t) for t in self.query_tokens])
        if self.norm_aware is not None:
            entry.update(norm_aware=self.norm_aware, saturated_share=self.saturated_share)
            entry['exponent_ceiling' if self.norm_aware else 'fixed_exponent'] = self.exponent
        return entry


def layer_statistics(layer: GatedAttention, x: Tensor, points: Sequence[Point] = (),
                     input_size: Optional[Size] = None, chunk: int = ROW_CHUNK) -> LayerStats:
    """Entropy / query-norm statistics and the attention maps of ``points`` for one layer.

    ``x`` is the layer's input, channels-last tokens ``(1, h, w, C)``; ``points`` are pixels
    ``(x, y)`` of the network input of size ``input_size`` (needed only with points).
    """
    if x.dim() != 4 or x.shape[0] != 1:
        raise ValueError(f'expected one layer input (1, h, w, C), got {tuple(x.shape)}')
    if points and input_size is None:
        raise ValueError('input_size (H, W) is needed to place query points on the token grid')
    grid = (x.shape[1], x.shape[2])
    tokens = grid[0] * grid[1]
    with torch.no_grad():
        q, k, _, _, rope = layer.project(x.float())
        qnorm = torch.linalg.vector_norm(q[0], dim=-1)  # (heads, N)
        rows = None
        if tokens > MAX_FULL_TOKENS:
            generator = torch.Generator().manual_seed(SAMPLE_SEED)
            rows = torch.randperm(tokens, generator=generator)[:SAMPLED_QUERIES].sort().values
            rows = rows.to(q.device)
        rope_for_entropy, label = entropy_rope(layer, rope)
        entropy = query_entropies(layer, q, k, rope_for_entropy, rows, chunk)[0]
        stats = LayerStats(
            mixer=type(layer).__name__, heads=layer.num_heads, grid=grid,
            entropy=entropy.flatten().cpu().numpy(),
            entropy_qnorm=(qnorm if rows is None else qnorm[:, rows]).flatten().cpu().numpy(),
            qnorm=qnorm.flatten().cpu().numpy(), entropy_rows=label,
            entropy_sampled=rows is not None)
        for point in points:
            row, col = query_token(point, input_size, grid)
            index = torch.tensor([row * grid[1] + col], device=q.device)
            weights = layer.attention_weights(q, k, rope, index)[0, :, 0]  # (heads, N), RoPE on
            stats.query_tokens.append((row, col))
            stats.maps.append(weights.mean(dim=0).reshape(grid).cpu().numpy())
        if isinstance(layer, NormAwareLinearAttention):
            stats.norm_aware = layer.cfg.norm_aware
            stats.saturated_share = saturated_share(layer, qnorm)
            if layer.cfg.norm_aware:
                stats.exponent = exponent_ceiling(layer)
                stats.saturation_norm = saturation_norm(layer)
            else:
                stats.exponent = layer.cfg.fixed_power
    return stats


# ------------------------------------------------------------------------------ the model side
def attention_layers(backbone: nn.Module) -> Dict[str, GatedAttention]:
    """Every :class:`GatedAttention` of a backbone, by module name."""
    layers = {name: m for name, m in backbone.named_modules() if isinstance(m, GatedAttention)}
    if not layers:
        raise ValueError(f'backbone {type(backbone).__name__} has no GatedAttention layer to '
                         f'analyse (expected a NaLaFormer)')
    return layers


def stage_of(name: str) -> Optional[int]:
    """``'layers.2.blocks.1.attn'`` -> 2 (NaLaFormer's stage list); ``None`` elsewhere."""
    match = re.search(r'(?:^|\.)layers\.(\d+)\.', name)
    return int(match.group(1)) if match else None


def capture_inputs(backbone: nn.Module, layers: Dict[str, GatedAttention],
                   inputs: Tensor) -> Dict[str, Tensor]:
    """One backbone forward; the input of every layer in ``layers``, by name."""
    captured: Dict[str, Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            captured[name] = args[0].detach()
        return hook

    handles = [layer.register_forward_hook(keep(name)) for name, layer in layers.items()]
    try:
        with torch.no_grad():
            backbone(inputs)
    finally:
        for handle in handles:
            handle.remove()
    missing = sorted(set(layers) - set(captured))
    if missing:
        raise RuntimeError(f'attention layers not called by the backbone forward: {missing}')
    return captured


def preprocess(model: nn.Module, image_bgr: np.ndarray) -> Tensor:
    """The backbone input of one BGR image ``(H, W, 3)`` through the config's data preprocessor
    (normalisation, BGR -> RGB, padding, as the config says)."""
    tensor = torch.from_numpy(np.ascontiguousarray(image_bgr)).permute(2, 0, 1).contiguous()
    return model.data_preprocessor(dict(inputs=[tensor], data_samples=None), False)['inputs']
