"""The block's convolutions with their CPU weight-gradient paths
(``nala_mm.ops.fused.conv_weight_grad``) against ``F.conv2d`` differentiated by autograd: same
outputs and gradients, the paths actually taken at the shapes they were measured for, and plain
``F.conv2d`` wherever no gradient is needed."""
import pytest
import torch
import torch.nn.functional as F

import nala_mm.ops.fused.conv_weight_grad as cwg
from nala_mm.models import NaLaFormer


def gradients(fn, inputs, grad):
    out = fn(*inputs)
    return (out, *torch.autograd.grad(out, inputs, grad))


# (in channels, out channels, kernel, stride, groups, height, width)
CASES = {
    'downsample 3x3/s2': (6, 10, 3, 2, 1, 11, 14),
    'dense 3x3/s1': (6, 10, 3, 1, 1, 9, 8),
    'depthwise 5x5 (LePE)': (8, 8, 5, 1, 8, 13, 10),
    'depthwise 7x7': (8, 8, 7, 1, 8, 12, 9),
    'depthwise 3x3': (8, 8, 3, 1, 8, 7, 11),
}


@pytest.mark.parametrize('split', [False, True], ids=['onednn', 'split-into-3x3'])
@pytest.mark.parametrize('channels_last', [False, True], ids=['cf', 'cl'])
@pytest.mark.parametrize('case', list(CASES))
def test_fast_gradients_match_autograd(case, channels_last, split, monkeypatch):
    if split:  # every map qualifies for the depthwise split
        monkeypatch.setattr(cwg, 'SPLIT_MIN_PIXELS', 0)
    cin, cout, kernel, stride, groups, height, width = CASES[case]
    torch.manual_seed(0)
    x = torch.randn(2, cin, height, width, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    weight = torch.randn(cout, cin // groups, kernel, kernel, dtype=torch.float64,
                         requires_grad=True)
    bias = torch.randn(cout, dtype=torch.float64, requires_grad=True)
    padding = (kernel // 2, kernel // 2)
    plain = lambda x, w, b: F.conv2d(x, w, b, (stride, stride), padding, 1, groups)  # noqa: E731
    fast = lambda x, w, b: cwg.conv2d(x, w, b, (stride, stride), padding, groups)  # noqa: E731
    out = plain(x, weight, bias)
    grad = torch.randn_like(out)
    for got, want in zip(gradients(fast, (x, weight, bias), grad),
                         gradients(plain, (x, weight, bias), grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_lepe_takes_the_split_path_at_stage_one_size(monkeypatch):
    """At a 96x96 map (a 384^2 image's first stage) the 5x5 weight gradient goes through the
    3x3 windows, in float32 within rounding of oneDNN's own gradient."""
    calls = []
    split = cwg.depthwise_weight_grad_by_3x3
    monkeypatch.setattr(cwg, 'depthwise_weight_grad_by_3x3',
                        lambda *args: calls.append(args[0].shape) or split(*args))
    torch.manual_seed(0)
    x = torch.randn(2, 96, 96, 16).permute(0, 3, 1, 2).requires_grad_()  # channels-last view
    weight = torch.randn(16, 1, 5, 5, requires_grad=True)
    d_out = torch.randn(2, 16, 96, 96)
    cwg.conv2d(x, weight, None, (1, 1), (2, 2), 16).backward(d_out)
    assert calls == [torch.Size([2, 16, 96, 96])]
    want = torch.ops.aten.convolution_backward(d_out, x.detach(), weight.detach(), None, [1, 1],
                                               [2, 2], [1, 1], False, [0, 0], 16,
                                               [False, True, False])[1]
    torch.testing.assert_close(weight.grad, want, rtol=1e-4, atol=1e-3)


@pytest.fixture
def fast_node_calls(monkeypatch):
    """Shapes of the weights every use of the fast op saw."""
    calls, real = [], cwg.conv2d_op

    def spy(*args):
        calls.append(tuple(args[1].shape))
        return real(*args)

    monkeypatch.setattr(cwg, 'conv2d_op', spy)
    return calls


def test_block_convs_take_the_fast_node_only_when_a_gradient_is_needed(fast_node_calls):
    """With gradients on and trainable weights the LePE and downsample convs run the fast op
    (under autocast too, on inputs cast to autocast's dtype); without gradients (inference) and
    with frozen weights they run plain ``F.conv2d``; every route gives F.conv2d's numbers."""
    model = NaLaFormer(arch=dict(embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1),
                                 num_heads=(1, 1, 1, 1)), mixers=('nala',) * 4)
    x = torch.randn(1, 8, 12, 12).contiguous(memory_format=torch.channels_last)
    for conv in (model.layers[0].blocks[0].attn.lepe, model.layers[0].downsample.reduction):
        want = F.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding, 1, conv.groups)
        fast_node_calls.clear()
        out = conv(x)
        assert fast_node_calls == [tuple(conv.weight.shape)]
        assert type(out.grad_fn).__name__ == 'GeneratedBackwardFor_nala_mm_conv2d_defaultBackward'
        assert torch.equal(out, want)

        fast_node_calls.clear()
        with torch.no_grad():
            assert torch.equal(conv.eval()(x), want)
        conv.requires_grad_(False)
        out = conv(x)
        conv.requires_grad_(True)
        assert out.grad_fn is None and torch.equal(out, want)
        assert fast_node_calls == []
        with torch.autocast('cpu', dtype=torch.bfloat16):
            got = conv(x)
            want = F.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding, 1, conv.groups)
        assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)
        assert fast_node_calls == [tuple(conv.weight.shape)]
        assert sorted(name for name, _ in conv.named_parameters()) == ['bias', 'weight']


def test_inference_forward_of_the_backbone_never_takes_the_fast_node(fast_node_calls):
    """Each conv of the backbone but the FFN's (which runs in gelu_conv) takes the fast op
    once per forward with gradients on, in eval mode too (the switch is the gradient, not the
    mode), and never under ``no_grad``; same outputs either way."""
    from nala_mm.models.depthwise import ResidualDepthwiseConv, TokenConv2d
    model = NaLaFormer(arch=dict(embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1),
                                 num_heads=(1, 1, 1, 1))).eval()
    token_convs = [tuple(m.weight.shape) for name, m in model.named_modules()
                   if isinstance(m, (TokenConv2d, ResidualDepthwiseConv))
                   and not name.endswith('ffn.dwconv')]
    # a LePE and two CPEs per block, a downsample after stages 1-3, the stem's four
    assert len(token_convs) == 3 * 4 + 3 + 4
    image = torch.randn(1, 3, 64, 64)
    with_grad = model(image)
    assert sorted(fast_node_calls) == sorted(token_convs)
    fast_node_calls.clear()
    with torch.no_grad():
        without = model(image)
    assert fast_node_calls == []
    for a, b in zip(with_grad, without):
        torch.testing.assert_close(a.detach(), b, rtol=1e-6, atol=1e-6)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError,
                       match=r"unknown mode 'fused'; expected one of \('fast', 'reference'\)"):
        cwg.conv2d(torch.randn(1, 2, 4, 4), torch.randn(2, 2, 3, 3), mode='fused')
