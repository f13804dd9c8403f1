# No weight decay on norms, LayerScale and the attention's output LayerNorm (NaLaFormer has no
# learned position tables: its RoPE angles are buffers). Used as paramwise_cfg by every config.
nala_no_decay = dict(custom_keys={
    'norm': dict(decay_mult=0.),
    'gamma_1': dict(decay_mult=0.),
    'gamma_2': dict(decay_mult=0.),
    'attn.ln': dict(decay_mult=0.),
})
