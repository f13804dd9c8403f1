# Ablation on ADE20K: the flagship UperNet + NaLaFormer-T recipe with the same token mixer in all
# four stages: NaLa without norm awareness: a fixed exponent 3 instead of p(||q||), so the
# output no longer depends on the query norm (the paper's cosine kernel otherwise).
# Every mixer shares the wrapper's parameters (qkvg, lepe, ln, out_proj), so the released T
# weights load into each; they were trained with NaLa (ReLU split) in stages 1-2 and softmax in
# 3-4, which favours those. For a from-scratch comparison add
#   --cfg-options model.backbone.init_cfg=None
_base_ = ['../ade20k_nala_upernet.py']
model = dict(backbone=dict(
    mixers=[dict(type='NormAwareLinearAttention', kernel='cosine', norm_aware=False)] * 4))
