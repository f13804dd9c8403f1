# Shared by every nala-mm config.
# No weight decay on norms, LayerScale and the attention's output LayerNorm (NaLaFormer has no
# learned position tables: its RoPE angles are buffers); used as the optimizer's paramwise_cfg.
nala_no_decay = dict(custom_keys={
    'norm': dict(decay_mult=0.),
    'gamma_1': dict(decay_mult=0.),
    'gamma_2': dict(decay_mult=0.),
    'attn.ln': dict(decay_mult=0.),
})
# Random generator states travel with each checkpoint, so a resumed run draws the same
# DropPath masks as an uninterrupted one.
custom_hooks = [dict(type='RNGStateHook')]
