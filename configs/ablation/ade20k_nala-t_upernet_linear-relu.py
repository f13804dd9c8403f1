# Ablation on ADE20K: the flagship UperNet + NaLaFormer-T recipe with the same token mixer in all
# four stages: plain linear attention, ReLU feature map: its output cannot depend on the query
# norm (the failure the paper starts from).
# Every mixer shares the wrapper's parameters (qkvg, lepe, ln, out_proj), so the released T
# weights load into each; they were trained with NaLa (ReLU split) in stages 1-2 and softmax in
# 3-4, which favours those. For a from-scratch comparison add
#   --cfg-options model.backbone.init_cfg=None
_base_ = ['../ade20k_nala_upernet.py']
model = dict(backbone=dict(mixers=[dict(type='LinearAttention', feature_map='relu')] * 4))
