"""Optimizer wrappers and constructors, in mmengine's root registries: the bf16 autocast wrapper
behind the tools' ``--amp`` on CPU, and the ViT layer-decay constructor."""
from .bf16_autocast_optim_wrapper import BF16AutocastOptimWrapper, enable_amp
from .layer_decay_optim_wrapper_constructor import ViTLayerDecayOptimWrapperConstructor, layer_id

__all__ = ['BF16AutocastOptimWrapper', 'enable_amp', 'ViTLayerDecayOptimWrapperConstructor',
           'layer_id']
