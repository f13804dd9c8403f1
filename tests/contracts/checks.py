"""The comparisons the mixer and family contracts share: a loss that weighs every output
element, the gradients it gives, a fullgraph compile held to eager, and a module's weights put
through a file and a strict load."""
import io
from typing import List, Sequence, Tuple

import torch
import torch._dynamo as dynamo
from torch import Tensor, nn

from tests.helpers import grad_errors


def as_list(out) -> List[Tensor]:
    """A module's output as a list of tensors (a backbone returns a tuple of maps)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def weighted_loss(outs: Sequence[Tensor]) -> Tensor:
    """Every output element reaches the loss with its own weight (a plain sum would let errors
    that cancel across elements pass), in float64."""
    return sum((o.double() * torch.linspace(-1, 1, o.numel(), dtype=torch.float64,
                                            device=o.device).view_as(o)).sum() for o in outs)


def forward_backward(fn, module: nn.Module, x: Tensor,
                     train: bool = True) -> Tuple[List[Tensor], List[Tensor]]:
    """``fn(x)``'s outputs and, with ``train``, the gradients of :func:`weighted_loss` for the
    input and every parameter of ``module`` that one reaches (``fn`` may be ``module`` compiled)."""
    module.zero_grad(set_to_none=True)
    inp = x.clone().requires_grad_(train)
    with torch.set_grad_enabled(train):
        torch.manual_seed(1)  # any random masks drawn alike in both runs
        outs = as_list(fn(inp))
        grads = []
        if train:
            weighted_loss(outs).backward()
            grads = [inp.grad] + [p.grad for p in module.parameters() if p.grad is not None]
    return [o.detach() for o in outs], grads


def assert_gradients_agree(actual: Sequence[Tensor], expected: Sequence[Tensor],
                           tol: float) -> None:
    assert len(actual) == len(expected) > 1
    errors = grad_errors(actual, expected)
    assert max(errors) < tol, errors


def compiled_matches_eager(module: nn.Module, x: Tensor, train: bool) -> None:
    """Compile ``module`` with ``fullgraph=True`` (a graph break raises) through ``aot_eager``
    (dynamo's graph and AOTAutograd's joint forward/backward graph, no code generation) and
    compare with eager: the outputs and, in training, the input's and every parameter's
    gradient. aot_eager runs the reference formulas' aten ops, eager the fast nodes: the two
    differ by float32 rounding."""
    dynamo.reset()
    module.train(train)
    compiled = torch.compile(module, backend='aot_eager', fullgraph=True)
    eager_outs, eager_grads = forward_backward(module, module, x, train)
    outs, grads = forward_backward(compiled, module, x, train)
    assert len(outs) == len(eager_outs)
    for got, want in zip(outs, eager_outs):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if train:
        assert_gradients_agree(grads, eager_grads, 1e-3)


def through_a_file(module: nn.Module) -> dict:
    """``module``'s state dict saved and loaded back as a checkpoint is (weights only)."""
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)
