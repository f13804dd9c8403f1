# Mask R-CNN + NaLaFormer-T on COCO, 1x (12 epochs), 8 GPUs x 2 images.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py', './models/nalaformer-t.py',
    'mmdet::_base_/datasets/coco_instance.py', './schedules/nala_det_1x.py',
    'mmdet::_base_/default_runtime.py', './nala_det_tta.py'
]
# nala_mm registers the models and changes nothing else; the project's tools add the host
# changes they rely on (resume under the upstream train.py: docs/user_guides/robustness.md).
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _base_.nalaformer_t,
        # Detection trains with 2 images per GPU: BN statistics that small are noise, so the
        # stem/downsample BNs keep their ImageNet statistics, and the conv stem stays frozen
        # (as mmdet does for ResNet's stem).
        frozen_stages=0,
        norm_eval=True),
    neck=dict(in_channels=[64, 128, 256, 512]))

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16 images per iteration
