# mmseg's Swin-T + UperNet on ADE20K (160k, 512x512) with NaLa in stages 1-2: the stock config,
# only the backbone type, its `mixers` and the optimizer entry for the mixers' LayerNorm change.
# The stock ImageNet Swin-T weights load: q/k/v and the output projection of the swapped stages
# carry into NaLa (docs/user_guides/swap.md), stages 3-4 keep their shifted-window attention.
_base_ = ['mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='NaLaSwinTransformer',
                           mixers=('nala', 'nala', 'softmax', 'softmax')))
# the stock 'norm' key misses the mixer's LayerNorm ('...attn.mixer.ln.weight'): no decay there
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'mixer.ln': dict(decay_mult=0.)}))
# the stock recipe's batch (8 GPUs x 2 images), for tools/train.py --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
