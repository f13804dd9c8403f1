"""The block's fused autograd nodes against the plain compositions they replace: same outputs
and gradients, fewer bytes kept for the backward.

* ``gelu_conv``: the FFN's ``conv(gelu(a))`` keeping ``a`` only.
The plain compositions are written out here, not taken from the ops' reference modes.
"""
import pytest
import torch
import torch.nn.functional as F

from nala_mm.ops import gelu_conv
from tests.helpers import DEVICES


def plain_gelu_conv(a, weight, bias, padding, groups):
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


def assert_same_gradients(actual, expected, inputs, tol):
    grad = torch.randn_like(expected)
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    for got, want in zip(torch.autograd.grad(actual, inputs, grad),
                         torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('kernel, groups', [(3, 12), (5, 12), (3, 1)])
def test_gelu_conv_matches_plain_composition(kernel, groups, channels_last, device):
    torch.manual_seed(0)
    a = torch.randn(2, 12, 7, 9, dtype=torch.float64).to(device)
    if channels_last:
        a = a.contiguous(memory_format=torch.channels_last)
    a.requires_grad_()
    weight = torch.randn(12, 12 // groups, kernel, kernel, dtype=torch.float64).to(device)
    bias = torch.randn(12, dtype=torch.float64).to(device)
    weight.requires_grad_()
    bias.requires_grad_()
    padding = (kernel // 2, kernel // 2)
    assert_same_gradients(gelu_conv(a, weight, bias, padding, groups),
                          plain_gelu_conv(a, weight, bias, padding, groups), (a, weight, bias),
                          1e-10)


def test_gelu_conv_saves_one_hidden_tensor_fewer():
    a = torch.randn(1, 64, 32, 32, requires_grad=True)
    weight = torch.randn(64, 1, 3, 3, requires_grad=True)
    hidden_bytes = a.numel() * 4
    fast = saved_bytes(lambda: gelu_conv(a, weight, None, (1, 1), 64))
    plain = saved_bytes(lambda: plain_gelu_conv(a, weight, None, (1, 1), 64))
    assert plain - fast == hidden_bytes  # gelu(a) is not kept
    assert fast == hidden_bytes + weight.numel() * 4  # a and the weight only


@pytest.mark.parametrize('op, args', [
    (gelu_conv, (torch.randn(1, 4, 5, 5), torch.randn(4, 1, 3, 3), None, (1, 1), 4)),
])
def test_unknown_mode_is_refused(op, args):
    with pytest.raises(ValueError, match="'fused'"):
        op(*args, mode='fused')


def test_gelu_conv_trains_under_bf16_autocast():
    """Parameters stay float32 while the activations are bf16 (mmengine's AMP): the backward,
    which runs outside autocast, must not mix the two."""
    torch.manual_seed(0)
    a = torch.randn(1, 8, 6, 6)
    weight = torch.randn(8, 1, 3, 3, requires_grad=True)
    bias = torch.randn(8, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        pre = (a * 1.0).to(torch.bfloat16).requires_grad_()
        out = gelu_conv(pre, weight, bias, (1, 1), 8)
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    assert weight.grad.dtype == torch.float32 and bias.grad.dtype == torch.float32
    expected = plain_gelu_conv(pre.detach().float(), weight.detach(), bias.detach(), (1, 1), 8)
    assert (out.float() - expected).norm() / expected.norm() < 2e-2
