# NaLaFormer-S + Mask R-CNN, COCO 1x (FPN inputs follow the variant's channels).
_base_ = ['./_base_/nala_mask-rcnn_1x.py']
model = dict(backbone=dict(arch='s'), neck=dict(in_channels=[64, 128, 320, 512]))
