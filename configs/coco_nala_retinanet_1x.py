# NaLaFormer-T + RetinaNet, COCO 1x: 12 epochs, AdamW 1e-4, steps at 8 and 11, fine-tuned from the
# authors' ImageNet weights (configs/_base_/nala_pretrained.py).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py', './_base_/models/nalaformer-t.py',
    'mmdet::_base_/datasets/coco_detection.py', './_base_/schedules/nala_det_1x.py',
    'mmdet::_base_/default_runtime.py', './_base_/nala_det_tta.py', './_base_/nala_pretrained.py'
]
# nala_mm registers the models and changes nothing else; the project's tools add the host
# changes they rely on (resume under the upstream train.py: docs/user_guides/robustness.md).
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _base_.nalaformer_t,
        # only the stages the FPN reads, so no parameter goes unused
        out_indices=(1, 2, 3),
        frozen_stages=0,
        norm_eval=True,
        init_cfg=dict(type='Pretrained', checkpoint={{_base_.nala_checkpoints.t}})),
    neck=dict(in_channels=[128, 256, 512], start_level=0, num_outs=5))

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16 images per iteration
