# `make demo`: the main UperNet + NaLaFormer config on the embedded synthetic ADE20K-layout data
# (nala_mm.datasets.synthetic_ade), sized for a 2-core CPU. Changes only the data root and the
# classes present there, the crop size, the schedule and the widths.
_base_ = ['../ade20k_nala_upernet.py']

data_root = 'data/demo/ade/ADEChallengeData2016'
# Real ADE20K class names; their ADE indices are the label values in the PNGs, and mmseg's
# label_map maps them to 0..5 exactly as it would for a class subset of real ADE20K.
metainfo = dict(classes=('wall', 'floor', 'windowpane', 'plant', 'painting', 'lamp'))
num_classes = 6
crop_size = (128, 128)

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=(32, 64, 128, 192), depths=(1, 1, 2, 1),
                  num_heads=(1, 2, 4, 6), mlp_ratios=(3, 3, 3, 3)),
        drop_path_rate=0.05,
        # trained from scratch here (no ImageNet weights), so NaLa with the paper's
        # cosine-inhibit kernel (the 'nala' shorthand) in the released hybrid
        mixers=('nala', 'nala', 'softmax', 'softmax'), init_cfg=None),
    decode_head=dict(in_channels=[32, 64, 128, 192], channels=64, num_classes=num_classes),
    auxiliary_head=dict(in_channels=128, channels=32, num_classes=num_classes))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(320, 160), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(320, 160), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader

# one process x 8 images: the batch the demo's learning rate is set for
auto_scale_lr = dict(enable=False, base_batch_size=8)

max_iters = 2000
optim_wrapper = dict(optimizer=dict(lr=2e-3, weight_decay=0.01))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=100),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=100, end=max_iters, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=400, max_keep_ckpts=2))
randomness = dict(seed=0)
