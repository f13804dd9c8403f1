"""tools/linearize.py and nala_mm.apis.linearize: attention transfer from a stock Swin into its NaLa
swap. The tool on a tiny Swin UperNet from a stock segmentor checkpoint (errors fall, the
output loads strictly, the softmax stages stay the teacher's, the features beat a plain swap),
backbone-only checkpoints through init_cfg (mmdet's Swin with convert_weights included), and
clear errors."""
import json

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from nala_mm.apis.linearize import (
    TransferOptions,
    attention_transfer,
    build_teacher,
    errors,
    load_teacher,
    swapped_blocks,
)
from nala_mm.models import DEFAULT_HYBRID
from nala_mm.models.swap import DetNaLaSwinTransformer, SegNaLaSwinTransformer
from tests.helpers import (
    DEMO_SEG_CFG,
    REPO,
    load_run_checkpoint,
    run_failing_tool,
    run_tool,
    vitdet_tiny_data,
)

SWIN = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7)
CONFIG = """_base_ = [{demo!r}]
data_root = {root!r}
crop_size = (96, 96)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(_delete_=True, type={type!r}, init_cfg=None, **{swin!r}{mixers}),
    decode_head=dict(in_channels=[32, 64, 128, 256], channels=32),
    auxiliary_head=dict(in_channels=128, channels=16))
train_pipeline = [
    dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomFlip', prob=0.5), dict(type='PackSegInputs')]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
"""


def write_configs(tmp_path, root):
    stock = tmp_path / 'stock.py'
    stock.write_text(CONFIG.format(demo=DEMO_SEG_CFG, root=str(root), type='SwinTransformer',
                                   swin=SWIN, mixers=''))
    swapped = tmp_path / 'swapped.py'
    swapped.write_text(CONFIG.format(demo=DEMO_SEG_CFG, root=str(root),
                                     type='NaLaSwinTransformer', swin=SWIN,
                                     mixers=f', mixers={DEFAULT_HYBRID!r}'))
    return stock, swapped


def build(config):
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    model = MODELS.build(Config.fromfile(str(config)).model)
    model.init_weights()
    return model


@pytest.mark.extended
@pytest.mark.integration
def test_the_tool_on_a_stock_segmentor_checkpoint(tmp_path, tiny_ade):
    stock_cfg, swapped_cfg = write_configs(tmp_path, tiny_ade)
    torch.manual_seed(0)
    stock = build(stock_cfg)
    checkpoint = tmp_path / 'stock.pth'
    torch.save({'state_dict': stock.state_dict(), 'meta': {}}, checkpoint)
    out = tmp_path / 'linearized.pth'
    log = run_tool('tools/linearize.py', swapped_cfg, checkpoint, '--out', out, '--iters', '60',
                   '--held-out', '2')
    assert 'attention transfer: 60 iterations' in log
    report = json.loads((tmp_path / 'linearized.json').read_text())
    blocks = [r for r in report['rows'] if r['name'].startswith('stages.')]
    assert [r['name'] for r in blocks] == [f'stages.{s}.blocks.{b}' for s in (0, 1)
                                           for b in (0, 1)]
    for row in blocks:  # every swapped block moves towards its teacher
        assert row['rel_l2_after'] < row['rel_l2_before'], row
    features = {r['name']: r for r in report['rows'] if r['name'].startswith('features.')}
    for i in (0, 1):  # stages 1-2: below 0.8 of the plain swap's error
        assert features[f'features.{i}']['rel_l2_after'] < \
            0.8 * features[f'features.{i}']['rel_l2_before'], features
    assert report['iters'] == 60 and report['seconds'] > 0 and report['whole_model'] is True

    swapped = build(swapped_cfg)
    saved = load_run_checkpoint(out)['state_dict']
    swapped.load_state_dict(saved, strict=True)  # the whole swapped model, heads included
    stock_state = stock.state_dict()
    for key, value in saved.items():
        if key.startswith(('backbone.stages.2.', 'backbone.stages.3.', 'decode_head.',
                           'auxiliary_head.', 'backbone.patch_embed.')):
            assert torch.equal(value, stock_state[key]), key  # untouched: the teacher's
    mixer = 'backbone.stages.0.blocks.0.attn.mixer.qkvg.weight'
    assert not torch.equal(saved[mixer][:96], stock_state[
        'backbone.stages.0.blocks.0.attn.w_msa.qkv.weight'])  # q/k/v trained (params='mixer')


@pytest.mark.parametrize('cls, convert', [(SegNaLaSwinTransformer, None),
                                          (DetNaLaSwinTransformer, True)],
                         ids=['mmseg-swin', 'mmdet-swin-convert_weights'])
def test_a_backbone_checkpoint_reloads_exactly_through_init_cfg(cls, convert, tmp_path):
    """A linearized backbone is written in the swapped model's own layout: reloading it
    through ``init_cfg`` gives the same tensors, mmdet's Swin with convert_weights=True too
    (converted again, patch_embed.projection would become projectionjection and drop)."""
    kwargs = dict(SWIN, **({} if convert is None else dict(convert_weights=convert)))
    torch.manual_seed(0)
    stock = build_teacher(cls(mixers=DEFAULT_HYBRID, **kwargs),
                          dict(kwargs, type='x', mixers=DEFAULT_HYBRID))
    stock.init_weights()
    path = tmp_path / 'stock_backbone.pth'
    torch.save({'state_dict': stock.state_dict()}, path)
    student = cls(mixers=DEFAULT_HYBRID, **kwargs)
    state, _ = student.carry_over_checkpoint(torch.load(path), str(path))
    student.load_state_dict(state, strict=False)
    teacher = build_teacher(student, dict(kwargs, type='x', mixers=DEFAULT_HYBRID))
    load_teacher(teacher, student, torch.load(path), str(path))
    gen = torch.Generator().manual_seed(0)
    attention_transfer(teacher, student, lambda: torch.randn(2, 3, 64, 64, generator=gen),
                       TransferOptions(iters=3), progress=False)
    out = tmp_path / 'linearized_backbone.pth'
    torch.save({'state_dict': student.state_dict()}, out)
    again = cls(mixers=DEFAULT_HYBRID, init_cfg=dict(type='Pretrained', checkpoint=str(out)),
                **kwargs)
    again.init_weights()
    for key, value in student.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    assert len(again.carry_over_report.already_swapped) == 4


@pytest.mark.parametrize('choice', [dict(inputs='teacher'), dict(target='attention'),
                                    dict(params='new')], ids=lambda c: '-'.join(c.values()))
def test_every_choice_lowers_the_error_and_new_keeps_the_carried_rows(choice):
    torch.manual_seed(0)
    teacher_model = SegNaLaSwinTransformer(mixers=('softmax',) * 4, **SWIN)
    teacher_model.init_weights()
    student = SegNaLaSwinTransformer(mixers=DEFAULT_HYBRID, **SWIN)
    checkpoint = {'state_dict': teacher_model.state_dict()}
    state, _ = student.carry_over_checkpoint(checkpoint)
    student.load_state_dict(state, strict=False)
    teacher = build_teacher(student, dict(SWIN, mixers=DEFAULT_HYBRID))
    load_teacher(teacher, student, checkpoint, 'stock')
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(2, 3, 64, 64, generator=gen) for _ in range(3)]
    before = errors(teacher, student, batches[:1])
    carried = student.stages[0].blocks[0].attn.mixer.qkvg.weight[:96].clone()
    out_proj = student.stages[0].blocks[0].attn.mixer.out_proj.weight.clone()
    attention_transfer(teacher, student, lambda: batches[1],
                       TransferOptions(iters=15, lr=3e-3, **choice), progress=False)
    after = errors(teacher, student, batches[:1])
    assert after['features.0'] < before['features.0']
    mixer = student.stages[0].blocks[0].attn.mixer
    kept = torch.equal(mixer.qkvg.weight[:96], carried) and torch.equal(mixer.out_proj.weight,
                                                                          out_proj)
    assert kept == (choice.get('params') == 'new')
    assert all(p.requires_grad for p in student.parameters())  # handed back trainable


def test_clear_errors(tmp_path, tiny_ade):
    stock = SegNaLaSwinTransformer(mixers=('softmax',) * 4, **SWIN)
    with pytest.raises(ValueError, match='no swapped block'):
        swapped_blocks(stock)
    student = SegNaLaSwinTransformer(mixers=DEFAULT_HYBRID, **SWIN)
    swapped_state = {'state_dict': student.state_dict()}  # a swapped checkpoint, not stock
    teacher = build_teacher(student, dict(SWIN, mixers=DEFAULT_HYBRID))
    with pytest.raises(ValueError, match='not a checkpoint of the stock model.*SwinTransformer'
                                         '.*missing'):
        load_teacher(teacher, student, swapped_state, 'swapped.pth')
    with pytest.raises(ValueError, match="target must be one of \\('block', 'attention'\\)"):
        TransferOptions(target='logits')


@pytest.mark.extended
@pytest.mark.integration
def test_the_tool_refuses_a_config_without_a_swap_or_a_dataloader(tmp_path, tiny_ade):
    stock_cfg, swapped_cfg = write_configs(tmp_path, tiny_ade)
    checkpoint = tmp_path / 'any.pth'
    torch.save({'state_dict': build(stock_cfg).state_dict()}, checkpoint)
    out = run_failing_tool('tools/linearize.py', stock_cfg, checkpoint, '--out', tmp_path / 'x')
    assert 'not a stock backbone with NaLa swapped in' in out
    out = run_failing_tool('tools/linearize.py', swapped_cfg, checkpoint, '--out',
                           tmp_path / 'x', '--cfg-options', 'train_dataloader=None')
    assert 'has no train_dataloader' in out


VITDET = """_base_ = [{base!r}]
side = (128, 128)
model = dict(
    data_preprocessor=dict(batch_augments=[dict(type='BatchFixedSizePad', size=side,
                                                pad_mask=True)]),
    backbone=dict(img_size=side, embed_dims=64, num_layers=3, num_heads=2, mlp_ratio=2,
                  out_indices=(2,), drop_path_rate=0.0, init_cfg=None,
                  mixers=[dict(type='WindowSoftmaxAttention', window_size=4)] * 2 + [{last!r}]),
    neck=dict(in_channels=64))
{data}"""


@pytest.mark.extended
@pytest.mark.integration
def test_the_tool_on_a_tiny_vitdet_whose_teacher_keeps_its_windows(tmp_path, tiny_coco):
    """A stock-layout ViTDet (windows of 4 on the 8 x 8 grid, one global SDPA block) into NaLa in
    every block: each block's error falls, and the output loads strictly into the detector."""
    from mmdet.registry import MODELS
    swap = 'configs/swap/coco_vitdet-b_mask-rcnn_lsj-100e'
    stock_cfg, nala_cfg = tmp_path / 'vitdet.py', tmp_path / 'vitdet_nala.py'
    data = vitdet_tiny_data(tiny_coco)
    stock_cfg.write_text(VITDET.format(base=str(REPO / f'{swap}.py'), last='sdpa', data=data))
    nala_cfg.write_text(VITDET.format(base=str(REPO / f'{swap}_nala-all.py'), last='nala',
                                      data=data))
    nala_cfg.write_text(nala_cfg.read_text().replace(
        "[dict(type='WindowSoftmaxAttention', window_size=4)] * 2 + ['nala']", "['nala'] * 3"))
    init_default_scope('mmdet')
    torch.manual_seed(0)
    stock = MODELS.build(Config.fromfile(str(stock_cfg)).model)
    stock.init_weights()
    checkpoint = tmp_path / 'vitdet.pth'
    torch.save({'state_dict': stock.state_dict(), 'meta': {}}, checkpoint)
    out = tmp_path / 'linearized.pth'
    run_tool('tools/linearize.py', nala_cfg, checkpoint, '--out', out, '--iters', '40',
             '--held-out', '2', '--teacher-config', stock_cfg)
    report = json.loads((tmp_path / 'linearized.json').read_text())
    blocks = [r for r in report['rows'] if r['name'].startswith('layers.')]
    assert [r['name'] for r in blocks] == ['layers.0', 'layers.1', 'layers.2']
    for row in blocks:
        assert row['rel_l2_after'] < row['rel_l2_before'], row
    nala = MODELS.build(Config.fromfile(str(nala_cfg)).model)
    assert list(nala.backbone.mixers) == ['nala'] * 3
    saved = load_run_checkpoint(out)['state_dict']
    nala.load_state_dict(saved, strict=True)
    stock_state = stock.state_dict()
    for key in ('neck.lateral.0.conv.weight', 'roi_head.bbox_head.fc_cls.weight'):
        assert torch.equal(saved[key], stock_state[key])  # the teacher's heads, untouched
