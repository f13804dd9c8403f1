# The COCO 1x schedule of the NaLaFormer detectors: 12 epochs, AdamW at 1e-4 (weight decay 0.05,
# none on norms and LayerScale), a 1000-iteration linear warm-up, steps at epochs 8 and 11, set
# for 16 images per iteration (the configs' 8 GPUs x 2 images). It carries nala_runtime.py, whose
# nala_no_decay it uses, so a config inherits it instead of mmdet's schedule_1x.
_base_ = ['mmdet::_base_/schedules/schedule_1x.py', '../nala_runtime.py']
max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg={{_base_.nala_no_decay}})
# the batch the learning rate is set for (tools/train.py --auto-scale-lr scales it)
auto_scale_lr = dict(enable=False, base_batch_size=16)
