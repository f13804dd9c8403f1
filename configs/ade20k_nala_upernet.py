# NaLaFormer-T (hybrid: NaLa in stages 1-2, softmax in 3-4) + UperNet, ADE20K 512x512, 160k,
# fine-tuned from the authors' ImageNet weights (configs/_base_/nala_pretrained.py).
_base_ = ['./_base_/nala_upernet.py', './_base_/nala_pretrained.py']
model = dict(backbone=dict(
    arch='t',
    init_cfg=dict(type='Pretrained', checkpoint={{_base_.nala_checkpoints.t}})))
