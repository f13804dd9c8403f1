"""What the contract suite enumerates, at collection time: the registered token mixers with the
variants each declares, and the backbone families from one table of tiny builders. The known
failures are declared here, beside what they fail, as strict xfails with their reason.

* **Mixers**: every class in mmengine's root ``MODELS`` that subclasses
  :data:`nala_mm.models.mixer_specs.MIXER_BASES`, at each of its ``contract_variants()``. A
  mixer registered before collection (a plugin, a ``conftest.py``) is enumerated with no test
  edited.
* **Families**: :data:`FAMILIES`, keyed by the registered class as a config names it
  (``'mmseg.NaLaSwinTransformer'``; ``'mmdet.NaLaVisionTransformer'`` is ViTDet's layout of the
  class mmdet registers). A new family is one entry; ``test_every_registered_family_is_in_the_zoo``
  fails until it has one.
"""
import inspect
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import pytest
import torch
import torch._inductor.exc
from mmengine.registry import MODELS

from nala_mm.models import DEFAULT_HYBRID, NaLaFormer
from nala_mm.models.mixer_specs import KEEP_STOCK, MIXER_BASES
from nala_mm.models.swap import (
    NaLaMixVisionTransformer,
    NaLaVisionTransformer,
    SegNaLaSwinTransformer,
)
from nala_mm.registry import host_imports


# ---------------------------------------------------------------------------------- mixers
class MixerVariant(NamedTuple):
    name: str      # the registered name, what ``-k`` selects
    variant: str   # the id under which the mixer declares it
    cfg: dict      # the config without sizes

    @property
    def id(self) -> str:
        return f'{self.name}-{self.variant}'


def registered_mixers() -> Dict[str, type]:
    """Registered name -> class, for every token mixer in mmengine's root ``MODELS``."""
    return {name: cls for name, cls in MODELS.module_dict.items()
            if isinstance(cls, type) and issubclass(cls, MIXER_BASES)}


def mixer_variants() -> List[MixerVariant]:
    return [MixerVariant(name, variant, dict(type=name, **kwargs))
            for name, cls in registered_mixers().items()
            for variant, kwargs in cls.contract_variants().items()]


# (contract, mixer variant's id, context) -> a strict xfail with its reason: a mixer's known
# failure, declared here (none now: LinearAttention's 'elu', whose compiled training #38 found
# failing, compiles in the tested torch, alone and in NaLaFormer)
MIXER_XFAILS: Dict[Tuple[str, str, str], pytest.MarkDecorator] = {}


def mixer_params(contract: str, contexts=('alone', 'nalaformer'), marks=(), extra=()) -> list:
    """``(variant, context, *extra)`` parameters of ``contract``, with their ids
    (``NAME-VARIANT-CONTEXT[-EXTRA]``) and known failures; ``marks`` (``{context: mark}``) go on
    every case of a context."""
    return [pytest.param(variant, context, *extra, id='-'.join(map(str, (variant.id, context,
                                                                         *extra))),
                         marks=[mark for mark in (MIXER_XFAILS.get((contract, variant.id, context)),
                                                  dict(marks).get(context)) if mark is not None])
            for variant in mixer_variants() for context in contexts]


# ---------------------------------------------------------------------------------- families
class CheckpointKeys(NamedTuple):
    """Where a stock checkpoint's tensors are, for the mis-shaped checkpoint contract: a layout
    with a swapped unit and a kept stock unit, and the keys of that layout."""
    mixers: tuple
    new: int            # whole tensors of the model that no stock file holds (LePE, mixer LN)
    swapped_qkv: str    # a swapped unit's q/k/v, as the stock file names it ...
    swapped_into: str   # ... and the model tensor it is carried into
    stock_proj: str     # a kept stock unit's output projection
    outside: str        # the patch embedding: 4 input channels in the file, 3 in the model
    fitting: str        # a tensor that fits, so loads in every case


class Family(NamedTuple):
    cls: type
    kwargs: dict                      # tiny sizes, no stochastic depth
    layouts: Dict[str, tuple]         # 'nala': NaLa in every unit; 'stock': the family's own
    checkpoint: Optional[CheckpointKeys] = None  # swapped families: their stock checkpoints

    def build(self, layout: str, **overrides) -> torch.nn.Module:
        return self.cls(**dict(self.kwargs, mixers=self.layouts[layout], **overrides))

    def parent(self) -> type:
        """What defines the family's arguments: the stock parent (NaLaFormer: itself)."""
        return self.cls if self.cls is NaLaFormer else self.cls.stock_parent()

    def reference(self, **overrides) -> torch.nn.Module:
        """The parent at the same sizes (NaLaFormer: with its stock layout)."""
        if self.cls is NaLaFormer:
            return self.build('stock', **overrides)
        return self.parent()(**dict(self.kwargs, **overrides))

    def parent_defines(self, arg: str) -> bool:
        """Whether ``arg`` is an argument of the parent (through ``**kwargs`` chains)."""
        for klass in self.parent().__mro__:
            if '__init__' not in vars(klass):
                continue
            params = inspect.signature(vars(klass)['__init__']).parameters
            if arg in params:
                return True
            if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                return False
        return False


# the tiny sizes: one block per stage, the first width 8-32, a head dim divisible by 4 (RoPE)
NALAFORMER = dict(arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1),
                            num_heads=(1, 1, 1, 1), mlp_ratios=(2, 2, 2, 2)), drop_path_rate=0.0)
SWIN = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 4), window_size=4,
            drop_path_rate=0.0)
SPATIAL_REDUCTION = dict(embed_dims=16, num_layers=[1, 1, 1, 1], num_heads=[1, 1, 2, 4],
                         drop_path_rate=0.0)
VIT = dict(img_size=(48, 48), patch_size=16, embed_dims=32, num_layers=2, num_heads=2,
           mlp_ratio=2, out_indices=(0, 1), drop_path_rate=0.0)
# ViTDet: no class token, the last layer's map, windows of 2 on the 3 x 4 patch grid
VITDET = dict(VIT, num_layers=3, with_cls_token=False, final_norm=False, out_indices=(2,))
WINDOW_2 = dict(type='WindowSoftmaxAttention', window_size=2)
STOCK_UNITS = (KEEP_STOCK,) * 4
STAGE_1 = ('nala', KEEP_STOCK, KEEP_STOCK, KEEP_STOCK)  # one swapped unit, the others stock

SWIN_KEYS = CheckpointKeys(
    STAGE_1, 4, 'stages.0.blocks.0.attn.w_msa.qkv.weight',
    'stages.0.blocks.0.attn.mixer.qkvg.weight', 'stages.1.blocks.0.attn.w_msa.proj.weight',
    'patch_embed.projection.weight', 'stages.1.blocks.0.ffn.layers.0.0.weight')
SR_KEYS = CheckpointKeys(
    STAGE_1, 4, 'layers.0.1.0.attn.attn.in_proj_weight', 'layers.0.1.0.attn.mixer.qkvg.weight',
    'layers.1.1.0.attn.attn.out_proj.weight', 'layers.0.0.projection.weight',
    'layers.1.1.0.ffn.layers.0.weight')
VIT_KEYS = CheckpointKeys(
    ('nala', KEEP_STOCK), 4, 'layers.0.attn.attn.in_proj_weight',
    'layers.0.attn.mixer.qkvg.weight', 'layers.1.attn.attn.out_proj.weight',
    'patch_embed.projection.weight', 'layers.1.ffn.layers.0.0.weight')
# ViTDet: a window block holds the stock layout, q/k/v moved as they are into mixer.qkv
VITDET_KEYS = VIT_KEYS._replace(mixers=(WINDOW_2, KEEP_STOCK, KEEP_STOCK), new=0,
                                swapped_into='layers.0.attn.mixer.qkv.weight')

FAMILIES: Dict[str, Family] = {
    'NaLaFormer': Family(NaLaFormer, NALAFORMER, dict(nala=('nala',) * 4, stock=DEFAULT_HYBRID)),
    'mmseg.NaLaSwinTransformer': Family(SegNaLaSwinTransformer, SWIN,
                                        dict(nala=('nala',) * 4, stock=STOCK_UNITS), SWIN_KEYS),
    'mmseg.NaLaMixVisionTransformer': Family(NaLaMixVisionTransformer, SPATIAL_REDUCTION,
                                             dict(nala=('nala',) * 4, stock=STOCK_UNITS),
                                             SR_KEYS),
    'mmseg.NaLaVisionTransformer': Family(NaLaVisionTransformer, VIT,
                                          dict(nala=('nala',) * 2, stock=(KEEP_STOCK,) * 2),
                                          VIT_KEYS),
}
if host_imports('mmdet'):
    from nala_mm.models.swap import DetNaLaSwinTransformer, NaLaPyramidVisionTransformerV2
    FAMILIES.update({
        'mmdet.NaLaSwinTransformer': Family(DetNaLaSwinTransformer, SWIN,
                                            dict(nala=('nala',) * 4, stock=STOCK_UNITS),
                                            SWIN_KEYS),
        'mmdet.NaLaPyramidVisionTransformerV2': Family(
            NaLaPyramidVisionTransformerV2, SPATIAL_REDUCTION,
            dict(nala=('nala',) * 4, stock=STOCK_UNITS), SR_KEYS),
        # ViTDet's layout: windows, then a global SDPA block (configs/swap/coco_vitdet-b_*)
        'mmdet.NaLaVisionTransformer': Family(NaLaVisionTransformer, VITDET,
                                              dict(nala=('nala',) * 3,
                                                   stock=(WINDOW_2, WINDOW_2, 'sdpa')),
                                              VITDET_KEYS),
    })

# odd sizes that every family takes (a 3 x 4 ViT patch grid, padded Swin windows)
IMAGE = (2, 3, 45, 61)

# inductor (torch 2.13) fails to lower the stock Mix-FFN's channels-first view of the tokens
# (mmseg's nlc_to_nchw) with dynamic sizes: "ValueRangeError: Invalid ranges [0:-1]" in
# ExternKernel.require_stride_order, called from GraphLowering.run_node on that saved view
MIT_INDUCTOR = pytest.mark.xfail(strict=True, raises=torch._inductor.exc.InductorError,
                                 reason='inductor cannot lower the Mix-FFN view at dynamic sizes')
# (contract, family, layout) -> the mark
FAMILY_XFAILS: Dict[Tuple[str, str, str], pytest.MarkDecorator] = {
    ('inductor-training', 'mmseg.NaLaMixVisionTransformer', 'nala'): MIT_INDUCTOR,
}


def family_params(contract: str, layouts=('nala', 'stock'),
                  where: Callable[[Family], bool] = lambda family: True, extra=()) -> list:
    """``(key, layout, *extra)`` parameters of ``contract`` over the zoo (``where`` filters
    families), ids ``KEY-LAYOUT[-EXTRA]``, with the known failures."""
    return [pytest.param(key, layout, *extra, id='-'.join(map(str, (key, layout, *extra))),
                         marks=[mark for mark in [FAMILY_XFAILS.get((contract, key, layout))]
                                if mark is not None])
            for key, family in FAMILIES.items() if where(family) for layout in layouts]
