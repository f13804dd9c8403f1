# NaLaFormer-B + Mask R-CNN, COCO 1x (FPN inputs follow the variant's channels).
_base_ = ['./_base_/nala_mask-rcnn_1x.py']
model = dict(backbone=dict(arch='b'), neck=dict(in_channels=[96, 192, 384, 512]))
