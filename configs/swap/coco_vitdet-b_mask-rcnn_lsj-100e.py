# ViTDet-B (Li et al., ECCV 2022): Mask R-CNN on a plain ViT-B, its last stride-16 map through
# SimpleFPN, trained on COCO with large-scale jitter at 1024x1024 for 100 epochs
# (184,375 iterations at 64 images). mmdet 3.3.0 from pip ships the LSJ data recipe but no
# ViTDet; the backbone, the pyramid and the layer-decay constructor come from nala_mm
# (docs/user_guides/vitdet.md).
# Stock layout: softmax in 14x14 windows in eight blocks, global in blocks 2, 5, 8 and 11,
# all through PyTorch's fused SDPA ('sdpa'; 'softmax' there keeps mmcv's MultiheadAttention,
# which materialises the N x N weights).
# Not ViTDet's: no decomposed relative-position biases. Position reaches the blocks only through
# the absolute pos_embed (interpolated to the 64x64 grid), as in the ViT the weights come from.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', 'mmdet::common/lsj-100e_coco-instance.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

image_size = (1024, 1024)
vitdet_layout = ['window', 'window', 'sdpa'] * 4
norm_cfg = dict(type='LN2d')
model = dict(
    data_preprocessor=dict(
        pad_size_divisor=32,
        batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]),
    backbone=dict(
        _delete_=True,
        type='NaLaVisionTransformer',
        img_size=image_size, patch_size=16, embed_dims=768, num_layers=12, num_heads=12,
        mlp_ratio=4, qkv_bias=True, patch_bias=True, drop_path_rate=0.1,
        norm_cfg=dict(type='LN', eps=1e-6),
        with_cls_token=False, final_norm=False, out_indices=(11,),
        mixers=vitdet_layout,
        # MAE's ViT-B (mae_pretrain_vit_base.pth, timm layout) after mmseg's
        # tools/model_converters/vit2mmseg.py; an ImageNet ViT-B converted so works as well
        init_cfg=dict(type='Pretrained', checkpoint='pretrain/mae_pretrain_vit_base_mmseg.pth')),
    neck=dict(_delete_=True, type='SimpleFPN', in_channels=768, out_channels=256, num_outs=5,
              norm_cfg=norm_cfg),
    # ViTDet's heads: a two-convolution RPN head, a 4conv1fc box head and a mask head with
    # LayerNorm between their convolutions
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=dict(type='Shared4Conv1FCBBoxHead', conv_out_channels=256, norm_cfg=norm_cfg),
        mask_head=dict(norm_cfg=norm_cfg)))

# inference at 1024 on the longer side, padded to 1024x1024 as in training
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

# ViTDet's schedule: 184,375 iterations at 64 images (32 GPUs x 2), warm-up 250, steps at
# 163,889 and 177,546
max_iters = 184375
train_dataloader = dict(batch_size=2, sampler=dict(type='InfiniteSampler', shuffle=True))
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=250),
    dict(type='MultiStepLR', begin=0, end=max_iters, by_epoch=False,
         milestones=[163889, 177546], gamma=0.1),
]
# AdamW with layer decay 0.7 (no weight decay on norms, biases, pos_embed). OptimWrapper:
# tools/train.py --amp switches to AMP on a GPU.
optim_wrapper = dict(
    _delete_=True, type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    constructor='ViTLayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(decay_rate=0.7))
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=5000, max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
custom_hooks = [dict(type='RNGStateHook')]
auto_scale_lr = dict(enable=False, base_batch_size=64)
