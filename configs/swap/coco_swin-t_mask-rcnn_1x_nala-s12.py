# mmdet's Mask R-CNN Swin-T 1x on COCO with NaLa in stages 1-2 (global over each stage);
# the official ImageNet Swin-T weights (convert_weights=True, as stock) carry over.
_base_ = ['mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='NaLaSwinTransformer',
                           mixers=('nala', 'nala', 'softmax', 'softmax')))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'mixer.ln': dict(decay_mult=0.)}))
# the stock recipe's batch (8 GPUs x 2 images), for tools/train.py --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
