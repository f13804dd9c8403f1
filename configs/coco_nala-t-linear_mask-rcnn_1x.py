# NaLaFormer-T with NaLa in all stages + Mask R-CNN, COCO 1x: linear cost at 1333x800. Starts
# from the released (hybrid) T weights; for stages 3-4 (trained with softmax) an initialisation.
_base_ = ['./coco_nala_mask-rcnn_1x.py']
model = dict(backbone=dict(
    mixers=(dict(type='NormAwareLinearAttention', kernel='relu'),) * 4))
