# NaLaFormer-T with NaLa in all stages + Mask R-CNN, COCO 1x: linear cost at 1333x800.
_base_ = ['./coco_nala_mask-rcnn_1x.py']
model = dict(backbone=dict(attn_types=('nala', 'nala', 'nala', 'nala')))
