# mmseg's SegFormer MiT-B0 on ADE20K (160k, 512x512) with NaLa in stages 1-2, attending at full
# resolution where MiT reduces keys/values (sr 8 and 4); stages 3-4 keep MiT's attention.
# Only the backbone type, `mixers` and the mixers' LayerNorm decay change; nothing of the mixer is
# named 'head', so the stock head lr x10 stays on the decode head alone.
_base_ = ['mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='NaLaMixVisionTransformer',
                           mixers=('nala', 'nala', 'softmax', 'softmax')))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'mixer.ln': dict(decay_mult=0.)}))
# the stock recipe's batch (8 GPUs x 2 images), for tools/train.py --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
