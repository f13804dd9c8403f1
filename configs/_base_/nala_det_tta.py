# Test-time augmentation for the detection configs (`python tools/test.py CONFIG CKPT --tta`):
# each image is predicted as is and horizontally flipped, at the test scale; mmdet's
# DetTTAModel maps the flipped boxes back and merges both views with per-class NMS.
# DetTTAModel (mmdet 3.3) merges boxes only: tools/test.py refuses --tta for a model that
# predicts masks (Mask R-CNN) unless the mask branch is dropped, see its message.
# More scales: override tta_pipeline with one Resize per scale in the first transform list.
tta_model = dict(
    type='DetTTAModel',
    tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))

tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale=(1333, 800), keep_ratio=True)],
            # flip after the resize, before any padding, so the boxes map back exactly
            [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
            [dict(type='LoadAnnotations', with_bbox=True)],
            [dict(type='PackDetInputs',
                  meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor',
                             'flip', 'flip_direction'))],
        ]),
]
