# `make demo-det`: the Mask R-CNN + NaLaFormer config on the embedded synthetic COCO-format data
# (nala_mm.datasets.synthetic_coco), sized for a 2-core CPU: data root and classes, image scale,
# schedule and widths change; trained from scratch (no ImageNet weights, the paper's cosine
# kernel), so nothing is frozen.
# out_norm_cfg=None: the backbone returns its raw stage features, without the per-output
# LayerNorms; the demo learns either way (benchmarks/results/studies/out_norm_study.json). Kept
# as the setting the committed demo run measured.
_base_ = ['../coco_nala_mask-rcnn_1x.py']

data_root = 'data/demo/coco/'
metainfo = dict(classes=('disc', 'square', 'triangle', 'star'))
num_classes = 4
image_scale = (160, 160)

model = dict(
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=(32, 64, 128, 192), depths=(1, 1, 2, 1),
                  num_heads=(1, 2, 4, 6), mlp_ratios=(3, 3, 3, 3)),
        out_norm_cfg=None, drop_path_rate=0.05, frozen_stages=-1, norm_eval=False,
        mixers=('nala', 'nala', 'softmax', 'softmax'), init_cfg=None),
    neck=dict(in_channels=[32, 64, 128, 192], out_channels=64),
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        bbox_head=dict(in_channels=64, fc_out_channels=256, num_classes=num_classes),
        mask_roi_extractor=dict(out_channels=64),
        mask_head=dict(in_channels=64, conv_out_channels=64, num_classes=num_classes)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomResize', scale=image_scale, ratio_range=(0.8, 1.25), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
# --tta at the demo's scale (the base's is COCO's 1333x800); boxes only, see nala_det_tta.py
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale=image_scale, keep_ratio=True)],
            [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
            [dict(type='LoadAnnotations', with_bbox=True)],
            [dict(type='PackDetInputs',
                  meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor',
                             'flip', 'flip_direction'))],
        ]),
]
train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json', classwise=True)
test_evaluator = val_evaluator

# one process x 4 images: the batch the demo's learning rate is set for
auto_scale_lr = dict(enable=False, base_batch_size=4)

max_epochs = 24
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
optim_wrapper = dict(optimizer=dict(lr=3e-4))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[18, 22],
         gamma=0.1),
]
default_hooks = dict(logger=dict(type='LoggerHook', interval=30),
                     checkpoint=dict(type='CheckpointHook', interval=8, max_keep_ckpts=2))
randomness = dict(seed=0)
