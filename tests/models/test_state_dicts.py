"""The one checkpoint unwrapper: every wrapping the package loads, one behaviour for prefixes."""
import pytest
import torch

from nala_mm.models.state_dicts import backbone_state_dict, state_dict_of

BACKBONE = {'patch_embed.proj.0.weight': torch.ones(2), 'layers.0.blocks.0.gamma_1': torch.zeros(1)}
HEADS = {'decode_head.conv_seg.weight': torch.full((3,), 2.0)}


def prefixed(prefix, state):
    return {prefix + key: value for key, value in state.items()}


def same(actual, expected):
    assert list(actual) == list(expected)
    assert all(torch.equal(actual[k], expected[k]) for k in expected)


@pytest.mark.parametrize('checkpoint', [
    BACKBONE,                                                              # bare
    {'state_dict': BACKBONE, 'meta': {'epoch': 3}},                        # mmengine, backbone
    {'state_dict': {**prefixed('backbone.', BACKBONE), **HEADS}},          # mmengine, segmentor
    {'state_dict': prefixed('module.', {**prefixed('backbone.', BACKBONE), **HEADS})},  # DDP
    {'model': BACKBONE, 'model_ema': HEADS, 'optimizer': {}, 'epoch': 300},  # authors' / DeiT
    {'model': prefixed('module.', BACKBONE)},                              # DeiT saved from DDP
], ids=['bare', 'mmengine-backbone', 'mmengine-segmentor', 'ddp-segmentor', 'authors',
        'deit-ddp'])
def test_every_wrapping_gives_the_backbone_tensors(checkpoint):
    same(backbone_state_dict(checkpoint), BACKBONE)


def test_a_wrapper_prefix_is_stripped_only_when_every_key_carries_it():
    """A model with a submodule called ``module`` keeps its names."""
    mixed = {'module.weight': torch.ones(1), 'head.weight': torch.zeros(1)}
    same(state_dict_of(mixed), mixed)
    same(state_dict_of(prefixed('module.', mixed)), mixed)


def test_heads_are_kept_for_a_whole_model_and_dropped_for_a_backbone():
    whole = {'state_dict': {**prefixed('backbone.', BACKBONE), **HEADS}}
    assert set(state_dict_of(whole)) == set(prefixed('backbone.', BACKBONE)) | set(HEADS)
    assert set(backbone_state_dict(whole)) == set(BACKBONE)


def test_ema_weights_and_clear_errors():
    same(state_dict_of({'model': BACKBONE, 'model_ema': HEADS}, use_ema=True), HEADS)
    with pytest.raises(KeyError, match="no 'model_ema' entry; it has \\['model'\\]"):
        state_dict_of({'model': BACKBONE}, use_ema=True)
    with pytest.raises(KeyError, match="neither 'state_dict' nor 'model' nor bare tensors.*"
                                       "\\['epoch', 'optimizer'\\]"):
        state_dict_of({'optimizer': {}, 'epoch': 3})
    with pytest.raises(TypeError, match='must be a dict, got list'):
        state_dict_of([1, 2])
