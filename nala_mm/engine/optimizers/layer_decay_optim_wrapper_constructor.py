"""Layer-wise learning-rate decay for a plain ViT backbone, in mmdet and mmseg configs.

ViTDet and BEiT/MAE fine-tuning scale each ViT layer's rate by ``decay ** (L + 1 - layer_id)``:
the embeddings (``patch_embed``, ``pos_embed``, ``cls_token``, a ``pre_ln``) are layer 0, the
backbone's ``layers.{i}`` are layer ``i + 1``, and everything else (the backbone's final norm,
the neck, the heads) is layer ``L + 1``, at the full rate. Norms, biases, ``pos_embed`` and
``cls_token`` take no weight decay. The installed constructors do not fit: mmdet's handles
ConvNeXt only, mmseg's accepts only BEiT/MAE class names and decays ``pos_embed``.

Config::

    optim_wrapper = dict(
        type='OptimWrapper',
        optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
        constructor='ViTLayerDecayOptimWrapperConstructor',
        paramwise_cfg=dict(decay_rate=0.7))

Registered: ``ViTLayerDecayOptimWrapperConstructor`` in mmengine's root registry (found under
either scope).
"""
from typing import Dict, List, Optional, Tuple

from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...registry import register_optim_wrapper_constructor

EMBEDDING_NAMES = ('patch_embed', 'pos_embed', 'cls_token', 'pre_ln')
NO_DECAY_NAMES = ('pos_embed', 'cls_token')
NORMS = (nn.LayerNorm, nn.GroupNorm, _BatchNorm)


def layer_id(name: str, num_layers: int) -> int:
    """The layer of parameter ``name`` (as ``model.named_parameters()`` spells it)."""
    if not name.startswith('backbone.'):
        return num_layers + 1
    inner = name[len('backbone.'):]
    if inner.split('.')[0] in EMBEDDING_NAMES:
        return 0
    if inner.startswith('layers.'):
        return int(inner.split('.')[1]) + 1
    return num_layers + 1


@register_optim_wrapper_constructor
class ViTLayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``paramwise_cfg=dict(decay_rate=r)``, ``0 < r <= 1``; the model's ``backbone`` must hold
    its blocks in ``layers`` (mmseg's ``VisionTransformer`` and the NaLa ViT do)."""

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None):
        paramwise_cfg = dict(paramwise_cfg or {})
        unknown = set(paramwise_cfg) - {'decay_rate'}
        if 'decay_rate' not in paramwise_cfg or unknown:
            raise ValueError(f'{type(self).__name__} takes paramwise_cfg=dict(decay_rate=r), '
                             f'got {paramwise_cfg}')
        self.decay_rate = float(paramwise_cfg['decay_rate'])
        if not 0 < self.decay_rate <= 1:
            raise ValueError(f'decay_rate must lie in (0, 1], got {self.decay_rate}')
        super().__init__(optim_wrapper_cfg, paramwise_cfg)  # non-empty: add_params runs

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        backbone = getattr(module, 'backbone', None)
        if backbone is None or not isinstance(getattr(backbone, 'layers', None), nn.ModuleList):
            raise TypeError(f'{type(self).__name__} needs a model whose backbone holds its blocks '
                            f'in backbone.layers (a ViT); got {type(module).__name__} with '
                            f'backbone {type(backbone).__name__}')
        num_layers = len(backbone.layers)
        no_decay = {id(p) for m in module.modules() if isinstance(m, NORMS)
                    for p in m.parameters(recurse=False)}
        groups: Dict[Tuple[int, bool], dict] = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            layer = layer_id(name, num_layers)
            decays = not (id(param) in no_decay or name.endswith('bias')
                          or name.split('.')[-1] in NO_DECAY_NAMES)
            scale = self.decay_rate ** (num_layers + 1 - layer)
            group = groups.setdefault((layer, decays), dict(
                params=[], lr=self.base_lr * scale,
                weight_decay=(self.base_wd or 0.0) if decays else 0.0,
                layer_id=layer, lr_scale=scale))
            group['params'].append(param)
        params.extend(groups[key] for key in sorted(groups))
        lowest = self.base_lr * self.decay_rate ** (num_layers + 1)
        MMLogger.get_current_instance().info(
            f'layer decay {self.decay_rate}: {len(groups)} parameter groups over {num_layers} '
            f'ViT layers (rates {lowest:.3g} .. {self.base_lr:.3g})')
