# NaLaFormer-T, the backbone of the NaLaFormer UperNet, FPN, Mask R-CNN and RetinaNet configs.
# A config inherits this file beside its mmseg/mmdet model base and writes
#   backbone=dict(_base_.nalaformer_t, <its own settings>)
# (mmengine allows one `model` among a config's bases, so the backbone is a named variable).
nalaformer_t = dict(
    _delete_=True,  # replaces the model base's stock backbone and its arguments
    type='NaLaFormer',
    arch='t',
    # The released hybrid: NaLa in stages 1-2, softmax attention in 3-4. The authors' ImageNet
    # weights were trained with the ReLU-split kernel (the released code's hard limit of the
    # cosine inhibit), so fine-tuning from them runs that kernel; the 'nala' shorthand is the
    # paper's cosine inhibit, for training from scratch or ablations (docs/user_guides/method.md,
    # "Paper vs released code").
    mixers=(dict(type='NormAwareLinearAttention', kernel='relu'),) * 2 + ('softmax',) * 2,
    out_indices=(0, 1, 2, 3))
