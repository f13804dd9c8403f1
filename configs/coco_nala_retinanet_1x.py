# NaLaFormer-T + RetinaNet, COCO 1x: 12 epochs, AdamW 1e-4, steps at 8 and 11, fine-tuned from the
# authors' ImageNet weights (configs/_base_/nala_pretrained.py).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py', './_base_/models/nalaformer-t.py',
    'mmdet::_base_/datasets/coco_detection.py', 'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py', './_base_/nala_runtime.py', './_base_/nala_det_tta.py',
    './_base_/nala_pretrained.py'
]
# nala_mm registers the models; nala_mm.compat the host changes the tools rely on (resume
# under weights-only loading, atomic checkpoints, CPU torchrun, data checks).
custom_imports = dict(imports=['nala_mm', 'nala_mm.compat'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _base_.nalaformer_t,
        # only the stages the FPN reads, so no parameter goes unused
        out_indices=(1, 2, 3),
        frozen_stages=0,
        norm_eval=True,
        init_cfg=dict(type='Pretrained', checkpoint={{_base_.nala_checkpoints.t}})),
    neck=dict(in_channels=[128, 256, 512], start_level=0, num_outs=5))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]
optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg={{_base_.nala_no_decay}})
train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16 images per iteration
# the batch the learning rate is set for (tools/train.py --auto-scale-lr scales it)
auto_scale_lr = dict(enable=False, base_batch_size=16)
