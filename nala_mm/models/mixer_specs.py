"""How a config names token mixers: the shorthands, the validation, ``build_mixer`` and the
named presets that the comparisons train.

A ``mixers`` entry is a shorthand (:data:`SHORTHANDS`) or a registered mixer's config without
its sizes, such as ``dict(type='NormAwareLinearAttention', kernel='relu')``; the stage or layer
that builds it supplies ``embed_dims`` and ``num_heads``. ``'softmax'`` has two meanings, kept
apart by :func:`mixer_config`'s ``keep_stock``:

* in :class:`~nala_mm.models.NaLaFormer` it is the global :class:`SoftmaxAttention` of the
  released 'v' stages;
* in a stock backbone with NaLa swapped in (:mod:`nala_mm.models.swap`) it keeps the stock
  attention module untouched (Swin's windows, MiT's spatial reduction, ViT's
  ``MultiheadAttention``), which is what makes an all-``'softmax'`` swap its parent exactly.
"""
from typing import Dict, List, Optional, Sequence, Union

from mmengine.registry import MODELS

from .mixers import GatedAttention
from .window_attention import WindowSoftmaxAttention

# What a token mixer subclasses: the shared gated wrapper, or ViTDet's plain softmax attention
# (a stock ViT's qkv/proj, in windows or global). Each base declares ``contract_variants()``, the
# settings the contract suite (tests/contracts) runs for every registered subclass.
MIXER_BASES = (GatedAttention, WindowSoftmaxAttention)

MixerEntry = Union[str, dict]

# What each shorthand stands for: the registered mixer with its own defaults ('nala' is the
# paper's NaLa, cosine-inhibit kernel). Other mixers or settings are written as config dicts.
SHORTHANDS: Dict[str, dict] = {
    'nala': dict(type='NormAwareLinearAttention'),
    'linear': dict(type='LinearAttention'),
    'softmax': dict(type='SoftmaxAttention'),
    # ViTDet's blocks: stock softmax attention in 14 x 14 windows, or global through SDPA
    'window': dict(type='WindowSoftmaxAttention', window_size=14),
    'sdpa': dict(type='WindowSoftmaxAttention', window_size=0),
}
# In a swapped stock backbone: the entry that keeps the stock attention module.
KEEP_STOCK = 'softmax'
# The released hybrid: NaLa in the two high-resolution stages, softmax attention in the others.
DEFAULT_HYBRID = ('nala', 'nala', 'softmax', 'softmax')


def mixer_config(entry: MixerEntry, keep_stock: bool = False) -> Optional[dict]:
    """One ``mixers`` entry -> the mixer's registry config without its sizes.

    With ``keep_stock`` (a swapped stock backbone) :data:`KEEP_STOCK` gives ``None``: keep the
    stock attention module.
    """
    if keep_stock and entry == KEEP_STOCK:
        return None
    if isinstance(entry, str):
        if entry not in SHORTHANDS:
            stock = f'{KEEP_STOCK!r} (the stock attention), ' if keep_stock else ''
            raise ValueError(f'unknown mixer {entry!r}; expected {stock}one of '
                             f'{tuple(SHORTHANDS)} or a registered mixer\'s config such as '
                             f"dict(type='NormAwareLinearAttention', kernel='relu')")
        return dict(SHORTHANDS[entry])
    if isinstance(entry, dict) and 'type' in entry:
        if {'embed_dims', 'num_heads'} & set(entry):
            raise ValueError(f'a mixer config takes its sizes from the stage or layer; remove '
                             f'embed_dims/num_heads from {entry}')
        return dict(entry)
    raise TypeError(f"a mixers entry must be one of {tuple(SHORTHANDS)} or a dict with a "
                    f"'type' naming a registered mixer, got {entry!r}")


def resolve_mixers(mixers: Sequence[MixerEntry], count: int, unit: str = 'stage',
                   keep_stock: bool = False) -> List[Optional[dict]]:
    """``mixers`` -> one config (``None``: keep the stock module) per stage or layer.

    ``unit`` names what the entries are for in the error messages (``'stage'``, ``'layer'``).
    """
    if isinstance(mixers, (str, dict)):  # one entry where a sequence is needed
        raise TypeError(f'mixers takes one entry per {unit} ({count}), got the single entry '
                        f'{mixers!r}')
    entries = list(mixers)
    if len(entries) != count:
        raise ValueError(f'mixers needs {count} entries (one per {unit}), got {len(entries)}: '
                         f'{tuple(entries)}')
    return [mixer_config(entry, keep_stock) for entry in entries]


def build_mixer(cfg: dict, embed_dims: int, num_heads: int,
                mode: Optional[str] = None) -> GatedAttention:
    """The mixer ``cfg`` (from :func:`mixer_config`) at the given sizes; ``mode``, the
    backbone's (:mod:`nala_mm.ops.mode`), unless ``None``. A config that names another mode
    than its backbone is refused: one switch means one thing."""
    cls = MODELS.get(cfg['type']) if isinstance(cfg['type'], str) else cfg['type']
    if cls is not None and not (isinstance(cls, type) and issubclass(cls, MIXER_BASES)):
        raise TypeError(f'mixer {cfg["type"]!r} built a {getattr(cls, "__name__", cls)}; a '
                        f'token mixer must subclass nala_mm.models.GatedAttention (the shared '
                        f'qkvg/LePE/gate wrapper) or WindowSoftmaxAttention')
    if mode is not None:
        if cfg.get('mode', mode) != mode:
            raise ValueError(f'mixer {cfg} sets mode={cfg["mode"]!r} inside a backbone built '
                             f'with mode={mode!r}; set it once, on the backbone')
        cfg = dict(cfg, mode=mode)
    return MODELS.build(dict(cfg, embed_dims=embed_dims, num_heads=num_heads))
