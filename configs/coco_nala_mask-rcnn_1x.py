# NaLaFormer-T (hybrid) + Mask R-CNN, COCO 1x: 12 epochs, AdamW 1e-4, steps at 8 and 11, fine-tuned
# from the authors' ImageNet weights (configs/_base_/nala_pretrained.py).
_base_ = ['./_base_/nala_mask-rcnn_1x.py', './_base_/nala_pretrained.py']
model = dict(backbone=dict(
    arch='t',
    init_cfg=dict(type='Pretrained', checkpoint={{_base_.nala_checkpoints.t}})))
