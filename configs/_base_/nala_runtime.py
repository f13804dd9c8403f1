# Shared by every nala-mm config.
# No weight decay on normalisation layers and LayerScale; used as the optimizer's paramwise_cfg.
# norm_decay_mult selects norm layers by type (mmengine: BatchNorm/SyncBN, LayerNorm, GroupNorm,
# InstanceNorm), so the stem's and downsamples' BNs, every LayerNorm (block norms, attn.ln,
# out_norm*) and the heads' norms are all caught whatever they are named. LayerScale's
# gamma_1/gamma_2 are plain Parameters of the block, so only a name can select them. A
# custom_keys match overrides norm_decay_mult for that parameter: a key added here must not
# match a norm layer's parameters unless it sets decay_mult=0 itself. NaLaFormer has no learned
# position tables (its RoPE angles are buffers).
nala_no_decay = dict(
    norm_decay_mult=0.,
    custom_keys={
        'gamma_1': dict(decay_mult=0.),
        'gamma_2': dict(decay_mult=0.),
    })
# Random generator states travel with each checkpoint, so a resumed run draws the same
# DropPath masks as an uninterrupted one.
custom_hooks = [dict(type='RNGStateHook')]
