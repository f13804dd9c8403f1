# NaLaFormer-T with NaLa in all four stages: cost stays linear in pixels at high resolution.
# Starts from the released (hybrid) T weights: every parameter has the same name and shape, but
# stages 3-4 were trained with softmax attention, so for them the weights are an initialisation.
_base_ = ['./ade20k_nala_upernet.py']
model = dict(backbone=dict(
    mixers=(dict(type='NormAwareLinearAttention', kernel='relu'),) * 4))
