"""The FFN's fused GELU + depthwise conv: same numbers and gradients as the plain composition,
one hidden-width tensor fewer saved for the backward."""
import pytest
import torch
import torch.nn.functional as F

from nala_mm.ops import gelu_conv


def plain(a, weight, bias, padding, groups):  # written out here, not the op's reference mode
    return F.conv2d(F.gelu(a), weight, bias, padding=padding, groups=groups)


def saved_bytes(fn) -> int:
    """Bytes autograd keeps for the backward of ``fn()`` (each storage counted once)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('kernel, groups', [(3, 12), (5, 12), (3, 1)])
def test_fast_matches_plain_composition_forward_and_gradients(kernel, groups, channels_last):
    torch.manual_seed(0)
    a = torch.randn(2, 12, 7, 9, dtype=torch.float64)
    if channels_last:
        a = a.contiguous(memory_format=torch.channels_last)
    a.requires_grad_()
    weight = torch.randn(12, 12 // groups, kernel, kernel, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(12, dtype=torch.float64, requires_grad=True)
    padding = (kernel // 2, kernel // 2)
    grad = torch.randn(2, 12, 7, 9, dtype=torch.float64)
    expected = plain(a, weight, bias, padding, groups)
    actual = gelu_conv(a, weight, bias, padding, groups)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    for got, want in zip(torch.autograd.grad(actual, (a, weight, bias), grad),
                         torch.autograd.grad(expected, (a, weight, bias), grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_fast_mode_saves_one_hidden_tensor_fewer():
    a = torch.randn(1, 64, 32, 32, requires_grad=True)
    weight = torch.randn(64, 1, 3, 3, requires_grad=True)
    hidden_bytes = a.numel() * 4
    fast = saved_bytes(lambda: gelu_conv(a, weight, None, (1, 1), 64))
    plain_saved = saved_bytes(lambda: plain(a, weight, None, (1, 1), 64))
    assert plain_saved - fast == hidden_bytes  # gelu(a) is not kept
    assert fast == hidden_bytes + weight.numel() * 4  # a and the weight only


def test_without_grad_and_unknown_mode():
    a, weight = torch.randn(1, 4, 5, 5), torch.randn(4, 1, 3, 3)
    torch.testing.assert_close(gelu_conv(a, weight, None, (1, 1), 4),
                               plain(a, weight, None, (1, 1), 4))
    with pytest.raises(ValueError, match="'fused'"):
        gelu_conv(a, weight, None, (1, 1), 4, mode='fused')
