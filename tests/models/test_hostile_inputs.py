"""Hostile inputs: tiny and extreme image sizes through the segmentor, grayscale/RGBA/palette
files through the pipeline, extreme activation magnitudes and drawn shapes through the attention."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mmengine.registry import init_default_scope
from PIL import Image

from nala_mm.apis.config_loading import load_config
from nala_mm.apis.data_samples import synthetic_batch
from nala_mm.models import NormAwareLinearAttention
from nala_mm.ops import NaLaConfig, nala_attention, rope_table
from tests.helpers import DEMO_SEG_CFG


@pytest.fixture(scope='module')
def segmentor_cfg():
    return load_config(DEMO_SEG_CFG)


@pytest.fixture(scope='module')
def segmentor(segmentor_cfg):
    cfg = segmentor_cfg
    init_default_scope('mmseg')
    from mmseg.registry import MODELS
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model.eval()


@pytest.mark.parametrize('height, width', [(17, 23), (64, 2048), (2048, 64), (1, 1)])
def test_segmentor_handles_tiny_and_extreme_shapes(segmentor, height, width):
    data = segmentor.data_preprocessor(synthetic_batch('mmseg', 1, height, width), False)
    with torch.no_grad():
        result = segmentor.predict(data['inputs'], data['data_samples'])[0]
    logits = result.seg_logits.data
    assert tuple(logits.shape[-2:]) == (height, width)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize('mode', ['L', 'RGBA', 'LA', 'P'])
def test_pipeline_reads_grayscale_rgba_and_palette_images(tmp_path, small_ade, segmentor_cfg,
                                                         mode):
    cfg = segmentor_cfg
    init_default_scope('mmseg')
    from mmengine.dataset import Compose
    pipeline = Compose(cfg.test_pipeline)
    source = Image.open(small_ade / 'images' / 'validation' / 'ADE_val_00000000.jpg')
    path = tmp_path / f'image_{mode}.png'
    source.convert(mode).save(path)
    seg = small_ade / 'annotations' / 'validation' / 'ADE_val_00000000.png'
    result = pipeline(dict(img_path=str(path), seg_map_path=str(seg), reduce_zero_label=True,
                           seg_fields=[], label_map=None))
    assert result['inputs'].shape[0] == 3  # always three channels for the model


@pytest.mark.parametrize('scale', [1e4, 1.0, 1e-8, 0.0])
def test_attention_layer_is_finite_at_extreme_magnitudes(scale):
    torch.manual_seed(0)
    layer = NormAwareLinearAttention(32, 2, kernel='cosine')
    x = (torch.randn(2, 7, 9, 32) * scale).requires_grad_()  # channels-last tokens
    out = layer(x)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


@settings(max_examples=40, deadline=None)
@given(height=st.integers(1, 9), width=st.integers(1, 9), heads=st.sampled_from([1, 2]),
       log_scale=st.floats(-8, 4), kernel=st.sampled_from(['cosine', 'relu']),
       seed=st.integers(0, 2 ** 16))
def test_property_attention_finite_and_fast_equals_reference(height, width, heads, log_scale,
                                                             kernel, seed):
    gen = torch.Generator().manual_seed(seed)
    head_dim = 8
    shape = (1, heads, height * width, head_dim)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) * 10 ** log_scale
               for _ in range(3))
    rope = tuple(t.double() for t in rope_table(height, width, head_dim))
    cfg = NaLaConfig(kernel=kernel)
    fast = nala_attention(q, k, v, cfg, rope)
    assert torch.isfinite(fast).all()
    reference = nala_attention(q, k, v, cfg, rope, mode='reference')
    assert torch.allclose(fast, reference, rtol=1e-7, atol=1e-7 * float(v.abs().max()))
