# mmseg's DeiT-S UperNet on ADE20K (512x512; the stock config's name says 160k, it inherits an 80k
# schedule) with NaLa in all 12 layers of the ViT. Every layer: a single softmax layer left would
# keep the cost quadratic in the tokens, which is what decides whole-image inference at high
# resolution (docs/user_guides/vit.md). Only the backbone type,
# `mixers` and the mixers' LayerNorm decay change; the DeiT-S weights of the stock config carry
# q/k/v and the output projection into the mixers.
_base_ = ['mmseg::vit/vit_deit-s16_upernet_8xb2-160k_ade20k-512x512.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='NaLaVisionTransformer', mixers=('nala',) * 12))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'mixer.ln': dict(decay_mult=0.)}))
# the stock recipe's batch (8 GPUs x 2 images), for tools/train.py --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
