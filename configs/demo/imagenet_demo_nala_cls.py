# `make demo-cls`: the ImageNet-1K classifier config (the authors' recipe, NaLaFormer-T) on the
# generated ImageNet-layout data (nala_mm.datasets.synthetic_imagenet: four classes, 64x64),
# sized for a 2-core CPU. Changes the data root and classes, the widths, the schedule and the
# augmentation (the recipe's RandAugment, random erasing, Mixup/CutMix and EMA are for 300
# epochs of ImageNet, not for a few hundred iterations on 800 images).
_base_ = ['../imagenet/nalaformer-t_8xb128-300e_in1k.py']

data_root = 'data/demo/imagenet'
# the generator's classes, in the sorted order in which mmpretrain numbers the class folders
metainfo = dict(classes=('lamp', 'painting', 'plant', 'windowpane'))
num_classes = 4
image_size = 64

data_preprocessor = dict(num_classes=num_classes)
model = dict(
    backbone=dict(
        # the segmentation demo's backbone (configs/demo/ade20k_demo_nala_upernet.py), so that
        # a checkpoint of this demo initialises that one (docs/user_guides/getting_started.md)
        arch=dict(_delete_=True, embed_dims=(32, 64, 128, 192), depths=(1, 1, 2, 1),
                  num_heads=(1, 2, 4, 6), mlp_ratios=(3, 3, 3, 3)),
        drop_path_rate=0.05),
    neck=dict(in_channels=192, out_channels=256),
    head=dict(num_classes=num_classes, in_channels=256),
    train_cfg=None)  # no Mixup/CutMix

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=image_size, crop_ratio_range=(0.75, 1.0),
         backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size=16, num_workers=1, persistent_workers=True,
    sampler=dict(_delete_=True, type='DefaultSampler', shuffle=True),
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=16, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1,))
test_evaluator = val_evaluator

# one process x 16 images: the batch the demo's learning rate is set for
auto_scale_lr = dict(enable=False, base_batch_size=16)
max_epochs = 16  # 50 iterations an epoch on the default 4 x 200 training images: 800 iterations
optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs)
custom_hooks = [dict(type='AuthorsCheckpointHook')]  # no EMA
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25),
    checkpoint=dict(type='CheckpointHook', interval=max_epochs, max_keep_ckpts=1,
                    save_best=None))
randomness = dict(seed=0)
