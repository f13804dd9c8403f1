# NaLaFormer-T (hybrid) + Mask R-CNN, COCO 1x: 12 epochs, AdamW 1e-4, steps at 8 and 11.
_base_ = ['./_base_/nala_mask-rcnn_1x.py']
