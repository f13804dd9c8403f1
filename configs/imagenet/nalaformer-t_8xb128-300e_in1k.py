# NaLaFormer-T on ImageNet-1K, 224x224, 300 epochs, 8 GPUs x 128 images: the authors' recipe
# (the defaults of their main.py, the flags of their pretrain.sh, the model of their NALA.py) in
# mmpretrain, item by item. Where mmpretrain's part differs from their timm/DeiT one, the comment
# names the difference and the nearest equivalent used. The xt/s/b/l configs change the variant
# only. tests/configs/test_imagenet_configs.py checks every item against their recipe.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]
# nala_mm registers the backbone (root registry), the tail and the checkpoint hook (mmpretrain's),
# and changes nothing else (resume under mmpretrain's own train.py: docs/user_guides/robustness.md).
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='NaLaFormer',
        arch='t',
        # The released flags: NaLa in stages 1-2, softmax in 3-4; the released code's NaLa is the
        # ReLU split (docs/user_guides/method.md, "Paper vs released code").
        mixers=(dict(type='NormAwareLinearAttention', kernel='relu'),) * 2 + ('softmax',) * 2,
        out_indices=(3,),
        out_norm_cfg=None,  # the tail follows stage 4 directly: no per-output norm
        # Stochastic depth: the variant's own rate (nala_mm's ARCH_SETTINGS; XT 0.1, T 0.1,
        # S 0.15, B 0.4, L 0.55), hard-coded per size in their NALA.py; pretrain.sh's
        # --drop-path 0.05 never reaches the model.
        drop_path_rate=None,
        norm_cfg=dict(type='SyncBN', requires_grad=True),  # their convert_sync_batchnorm
        # Their _init_weights: every Conv2d truncated normal (std 0.02, zero bias); the Linear
        # layers keep PyTorch's default initialisation.
        init_cfg=dict(type='TruncNormal', layer='Conv2d', std=0.02, bias=0.0)),
    # proj Linear(512, 1024), BatchNorm, SiLU, global average pooling (their tail before the head)
    neck=dict(type='NaLaFormerClsNeck', in_channels=512, out_channels=1024,
              norm_cfg=dict(type='SyncBN')),
    head=dict(
        type='LinearClsHead',  # their 1x1-conv head on the pooled map: a linear layer
        num_classes=1000,
        in_channels=1024,
        # Label smoothing 0.1 on the mixed targets (timm's Mixup smooths them; with SoftTarget
        # cross-entropy that is mmpretrain's smoothing 'original' on mixed one-hot labels).
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0)),
    # Mixup 0.8 / CutMix 1.0, one of the two per batch with equal chance (timm: prob 1.0,
    # switch prob 0.5, mode 'batch').
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]),
)

# Data: the base's pipeline is their timm transform. RandomResizedCrop 224 (scale 0.08-1),
# bicubic; horizontal flip; RandAugment 'rand-m9-mstd0.5-inc1' = policies 'timm_increasing'
# (the 'inc1' ops), 2 ops, magnitude 9 of 10, std 0.5; random erasing 0.25 in timm's 'pixel'
# mode = mode 'rand' (per-pixel normal noise of the data's mean and std), one box. Colour jitter
# 0.4 is passed by their main.py, but timm applies it only when no AutoAugment/RandAugment
# policy is set, so it is not applied there and not here. Evaluation: resize the short side to
# 256 (bicubic), centre crop 224, as theirs.
train_dataloader = dict(
    batch_size=128,
    # Repeated augmentation (their RASampler, DeiT's): each image 3 times per epoch, spread over
    # the processes, each process keeping its share of one epoch. mmpretrain's RepeatAugSampler
    # is the same sampler except that it keeps ceil(N / processes) samples per process where
    # theirs rounds the epoch down to a multiple of 256 images (1,281,024 of 1,281,167).
    sampler=dict(type='RepeatAugSampler', shuffle=True, num_repeats=3))
val_dataloader = dict(batch_size=64)  # their evaluation batch, half the training one
test_dataloader = val_dataloader

# AdamW, lr 5e-4 x total batch / 512 = 1e-3 at 8 x 128, betas (0.9, 0.999), eps 1e-8, weight
# decay 0.05 except on one-dimensional parameters and biases (timm's filter: norms and biases; the
# LayerScale gammas, 4-d, are decayed), no gradient clipping.
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=5e-4 * 1024 / 512, betas=(0.9, 0.999), eps=1e-8,
                   weight_decay=0.05),
    paramwise_cfg=dict(_delete_=True, flat_decay_mult=0.0, bias_decay_mult=0.0))
# The lr follows the total batch linearly (their 5e-4 x batch / 512): --auto-scale-lr scales it
# from the 1024 it is set for. (Their warm-up start 1e-6 stays absolute; here it scales along.)
auto_scale_lr = dict(enable=False, base_batch_size=1024)

# 5 warm-up epochs from 1e-6, then cosine to 1e-5 at epoch 300, stepped once per epoch as their
# timm scheduler is. Their cosine phase counts from epoch 0 over 300 epochs (so it starts at
# 99.93 % of the peak at epoch 5); mmengine's counts from its begin over the 295 epochs left:
# the rates differ by at most 1.5 % of the peak (around epoch 108). Their main.py also steps
# after each epoch with that epoch's index, so their epochs 0 and 1 both run at 1e-6 and every
# later rate comes one epoch later than here.
# (mmengine's LinearLR reaches its end factor at step end - 1: end=6 ramps over epochs 0-4 exactly
# as theirs and reaches the peak at epoch 5, where the cosine begins.)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / (5e-4 * 1024 / 512), by_epoch=True, begin=0, end=6),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=300),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)

# Model EMA, decay 0.99996 per 512 images: their main.py raises it to the power total batch /
# 512 and updates once per step, i.e. 0.99996 ** 2 per step at 1024. mmpretrain's EMAHook takes
# momentum = 1 - decay, and a fixed one (another total batch: change it as they would). timm's
# ModelEma averages the buffers too (BatchNorm statistics): update_buffers=True. Their main.py
# evaluates both the model and its EMA every epoch: evaluate_on_origin=True.
custom_hooks = [
    dict(type='AuthorsCheckpointHook'),  # their {'model', 'model_ema'} files load as they are
    dict(type='EMAHook', momentum=1 - 0.99996 ** (8 * 128 / 512), update_buffers=True,
         evaluate_on_origin=True, priority='ABOVE_NORMAL'),
]
# A checkpoint per epoch, the last three kept (resume), and the best top-1 (their best.pth).
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3,
                                     save_best='auto'))
