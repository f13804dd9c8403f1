"""What the attention layers of a backbone do on one input: the statistics behind the paper's
Figure 1 (a larger query norm gives a sharper attention row) for every
:class:`~nala_mm.models.GatedAttention` of a model. ``tools/analyze_attention.py`` draws them
(docs/user_guides/mixers.md, 'Looking at the attention').

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
* **A norm-dependent query exponent** (NaLa's ``p = lam (tau + tanh(||q|| / s))``): the share
  of (head, query) pairs within 1 % of its ceiling ``lam (tau + 1)`` (:func:`saturated_share`);
  see docs/user_guides/method.md, 'Query norm x direction'.

Nothing here knows a mixer class or a backbone's module names: each layer says whether its rows
with RoPE are distributions (:attr:`GatedAttention.rope_rows_are_distributions`), its exponent
for a query norm and the exponent's ceiling (:meth:`GatedAttention.query_exponent`,
:meth:`~GatedAttention.exponent_ceiling`), and the backbone says which stage holds a layer
(``stage_of``). :func:`analyze_backbone` is the one entry point (``tools/analyze_attention.py``,
projects/longrange/study.py).
"""
import math
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from ..models import GatedAttention
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
    none where the layer's rows with RoPE are not distributions (kernelised mixers)."""
    if rope is None or not layer.rope_rows_are_distributions:
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


def saturated_share(layer: GatedAttention, qnorm: Tensor) -> Optional[float]:
    """Share of queries (norms ``qnorm``) whose exponent, as the layer computes it, is >= 99 %
    of its ceiling; ``None`` when the layer has no norm-dependent exponent."""
    ceiling = layer.exponent_ceiling()
    if ceiling is None:
        return None
    power = layer.query_exponent(qnorm.double())
    return float((power >= SATURATION * ceiling).double().mean())


def saturation_norm(layer: GatedAttention) -> Optional[float]:
    """The query norm from which the layer's exponent is >= 99 % of its ceiling."""
    ceiling = layer.exponent_ceiling()
    return None if ceiling is None else layer.query_norm_at_exponent(SATURATION * ceiling)


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
    # tokens without a grid position ahead of the grid (a ViT's class token): their share of
    # each point's row, and their own rows' entropy (mean over heads; without RoPE for
    # kernelised mixers, as every entropy here)
    num_prefix: int = 0
    prefix_weights: List[float] = field(default_factory=list)
    prefix_entropy: Optional[float] = None
    stage: Optional[int] = None  # as the backbone answers (a layer's index in a ViT)
    # layers with a query exponent (NaLa) only, from here down
    norm_aware: Optional[bool] = None  # whether the exponent depends on the query norm
    saturated_share: Optional[float] = None
    exponent: Optional[float] = None  # ceiling when norm-aware, else the fixed exponent
    saturation_norm: Optional[float] = None  # ||q|| from which the exponent counts as saturated
    exponent_mean: Optional[float] = None  # mean exponent over (head, query)

    @property
    def tokens(self) -> int:
        """Every token the layer mixes: the prefix tokens and the grid."""
        return self.num_prefix + self.grid[0] * self.grid[1]

    @property
    def spearman(self) -> float:
        return spearman(self.entropy, self.entropy_qnorm)

    def summary(self, name: str) -> dict:
        """This layer's entry of ``attention_stats.json``."""
        entry = dict(layer=name, mixer=self.mixer, stage=self.stage, tokens=self.tokens,
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
        if self.num_prefix:
            entry.update(prefix_tokens=self.num_prefix, prefix_row_entropy=self.prefix_entropy,
                         query_prefix_weights=self.prefix_weights)
        if self.norm_aware is not None:
            entry.update(norm_aware=self.norm_aware, saturated_share=self.saturated_share)
            entry['exponent_ceiling' if self.norm_aware else 'fixed_exponent'] = self.exponent
            if self.norm_aware:
                entry['exponent_mean_over_ceiling'] = self.exponent_mean / self.exponent
        return entry


def layer_statistics(layer: GatedAttention, x: Tensor, points: Sequence[Point] = (),
                     input_size: Optional[Size] = None, chunk: int = ROW_CHUNK,
                     hw_shape: Optional[Size] = None, num_prefix: int = 0) -> LayerStats:
    """Entropy / query-norm statistics and the attention maps of ``points`` for one layer.

    ``x`` is the layer's input as its forward took it: channels-last tokens ``(1, h, w, C)``,
    or a sequence ``(1, num_prefix + h*w, C)`` with its grid ``hw_shape``; ``points`` are pixels
    ``(x, y)`` of the network input of size ``input_size`` (needed only with points).
    """
    if x.shape[0] != 1 or x.dim() != (3 if hw_shape is not None else 4):
        raise ValueError(f'expected one layer input (1, h, w, C), or (1, L, C) with its '
                         f'hw_shape, got {tuple(x.shape)} with hw_shape={hw_shape}')
    if points and input_size is None:
        raise ValueError('input_size (H, W) is needed to place query points on the token grid')
    grid = tuple(hw_shape) if hw_shape is not None else (x.shape[1], x.shape[2])
    tokens = num_prefix + grid[0] * grid[1]
    with torch.no_grad():
        q, k, _, _, rope = layer.project(x.float(), hw_shape, num_prefix)
        qnorm = torch.linalg.vector_norm(q[0], dim=-1)  # (heads, L)
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
            entropy_sampled=rows is not None, num_prefix=num_prefix)
        if num_prefix:
            prefix = torch.arange(num_prefix, device=q.device)
            stats.prefix_entropy = float(query_entropies(layer, q, k, rope_for_entropy,
                                                         prefix, chunk)[0].mean())
        for point in points:
            row, col = query_token(point, input_size, grid)
            index = torch.tensor([num_prefix + row * grid[1] + col], device=q.device)
            # (heads, L), RoPE on; the mean over heads
            weights = layer.attention_weights(q, k, rope, index)[0, :, 0].mean(dim=0)
            stats.query_tokens.append((row, col))
            stats.maps.append(weights[num_prefix:].reshape(grid).cpu().numpy())
            if num_prefix:
                stats.prefix_weights.append(float(weights[:num_prefix].sum()))
        power = layer.query_exponent(qnorm.double())
        if power is not None:
            ceiling = layer.exponent_ceiling()
            stats.norm_aware = ceiling is not None
            stats.exponent_mean = float(power.mean())
            stats.exponent = stats.exponent_mean if ceiling is None else ceiling
            stats.saturated_share = saturated_share(layer, qnorm)
            stats.saturation_norm = saturation_norm(layer)
    return stats


# ------------------------------------------------------------------------------ the model side
def attention_layers(backbone: nn.Module) -> Dict[str, GatedAttention]:
    """Every :class:`GatedAttention` of a backbone, by module name."""
    layers = {name: m for name, m in backbone.named_modules() if isinstance(m, GatedAttention)}
    if not layers:
        raise ValueError(f'backbone {type(backbone).__name__} has no token mixer (a '
                         f'nala_mm GatedAttention) to analyse; expected a NaLaFormer or a stock '
                         f'backbone with NaLa swapped in (nala_mm.models.swap)')
    return layers


class LayerInput(NamedTuple):
    """What a token mixer's forward was called with (:meth:`GatedAttention.forward`)."""
    x: Tensor
    hw_shape: Optional[Size] = None
    num_prefix: int = 0


def capture_inputs(backbone: nn.Module, layers: Dict[str, GatedAttention],
                   inputs: Tensor) -> Dict[str, LayerInput]:
    """One backbone forward; the input of every layer in ``layers``, by name."""
    captured: Dict[str, LayerInput] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> None:
            call = dict(zip(('x', 'hw_shape', 'num_prefix'), args), **kwargs)
            hw_shape = call.get('hw_shape')
            captured[name] = LayerInput(call['x'].detach(),
                                        None if hw_shape is None else tuple(hw_shape),
                                        call.get('num_prefix', 0))
        return hook

    handles = [layer.register_forward_hook(keep(name), with_kwargs=True)
               for name, layer in layers.items()]
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


def analyze_backbone(backbone: nn.Module, inputs: Tensor, points: Sequence[Point] = (),
                     input_size: Optional[Size] = None, progress: bool = False,
                     chunk: int = ROW_CHUNK) -> Dict[str, LayerStats]:
    """The statistics of every token mixer of ``backbone`` on one input batch ``(1, 3, H, W)``,
    by layer name, each with its stage as the backbone answers (``backbone.stage_of``).

    ``points`` are pixels ``(x, y)`` of the network input of size ``input_size`` (default: the
    input's own size) whose attention rows are kept. ``progress`` shows a bar over the layers.
    """
    if inputs.dim() != 4 or inputs.shape[0] != 1:
        raise ValueError(f'expected one image batch (1, C, H, W), got {tuple(inputs.shape)}')
    input_size = tuple(inputs.shape[-2:]) if input_size is None else input_size
    layers = attention_layers(backbone)
    captured = capture_inputs(backbone, layers, inputs)
    stage_of = getattr(backbone, 'stage_of', None)
    names = layers.items()
    if progress:
        from tqdm import tqdm
        names = tqdm(names, desc='attention layers', unit='layer')
    result = {}
    for name, layer in names:
        x, hw_shape, num_prefix = captured.pop(name)
        stats = layer_statistics(layer, x, points, input_size, chunk, hw_shape, num_prefix)
        stats.stage = stage_of(name) if stage_of is not None else None
        result[name] = stats
    return result
