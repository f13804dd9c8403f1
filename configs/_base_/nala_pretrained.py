# Where the authors' ImageNet-1K NaLaFormer checkpoints are expected: set the paths here once.
# Their DeiT-style .pth files ({'model': ..., 'model_ema': ...}) load as they are; or convert them
# once with `python tools/convert_checkpoint.py SRC DST --arch t` and point here at DST. A single
# run can override with --cfg-options model.backbone.init_cfg.checkpoint=PATH, or train from
# scratch with the options the error message prints when the file is missing.
nala_checkpoints = dict(
    xt='checkpoints/nalaformer_xt.pth',
    t='checkpoints/nalaformer_t.pth',
    s='checkpoints/nalaformer_s.pth',
    b='checkpoints/nalaformer_b.pth',
    l='checkpoints/nalaformer_l.pth',
)
