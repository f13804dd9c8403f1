"""The contracts every backbone family of the zoo (:data:`tests.contracts.zoo.FAMILIES`) holds,
with NaLa in every unit (``'nala'``) and with its own attention kept (``'stock'``): the
arguments the parent defines (``out_indices``, ``frozen_stages``, ``frozen_exclude``,
``norm_eval``, ``with_cp``) mean what they mean in the parent, including for the swapped mixers;
its weights go through a file and a ``Pretrained`` checkpoint exactly; a mis-shaped stock
checkpoint is refused (or, with ``pretrained_mismatch='skip'``, skipped); fast and reference
modes agree; fp16 autocast stays finite and close to float32; it compiles as one graph
(make test-extended). Compiled training at three sizes reads the same zoo
(tests/compile/test_training.py).

Test ids are ``KEY-LAYOUT``, the key the registered class as a config names it
(``mmdet.NaLaVisionTransformer`` is ViTDet's layout).
"""
import logging
import re
from typing import Dict, Tuple

import pytest
import torch
from torch import nn

from nala_mm.models import NaLaFormer
from nala_mm.models.mixer_specs import KEEP_STOCK, MIXER_BASES
from nala_mm.models.swap import SwappedAttentionMixin
from nala_mm.registry import host_imports, models_registry
from tests.contracts.checks import as_list, compiled_matches_eager, forward_backward, through_a_file
from tests.contracts.zoo import FAMILIES, IMAGE, Family, family_params
from tests.helpers import DEVICES, LogRecords, rel_err

# the value each argument takes in its contract (one that changes something in every family)
PARENT_ARGS = {'frozen_stages': 1, 'frozen_exclude': ['pos_embed'], 'norm_eval': True}


def built(family: Family, layout: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    model = family.build(layout, **overrides)
    model.init_weights()
    return model


def images(device: str = 'cpu') -> torch.Tensor:
    return torch.randn(IMAGE, generator=torch.Generator().manual_seed(0)).to(device)


def outputs(model: nn.Module, x: torch.Tensor):
    model.eval()  # (mmseg's Swin and ViT return None from train())
    with torch.no_grad():
        return as_list(model(x))


# ---------------------------------------------------------------------------------- registry
def test_every_registered_family_is_in_the_zoo():
    """A backbone registered with a token mixer per unit (NaLaFormer, a swapped stock family)
    gets the family contracts by one zoo entry: the suite fails until it has one."""
    registered = set()
    for scope in (None, 'mmseg', *(('mmdet',) if host_imports('mmdet') else ())):
        for name, cls in models_registry(scope).module_dict.items():
            if isinstance(cls, type) and issubclass(cls, (NaLaFormer, SwappedAttentionMixin)):
                registered.add(name if scope is None else f'{scope}.{name}')
    assert registered == set(FAMILIES)
    for key, family in FAMILIES.items():
        scope, _, name = key.rpartition('.')
        assert models_registry(scope or None).get(name) is family.cls, key


# ---------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize('key,layout', family_params('out-indices'))
def test_out_indices_select_the_units_the_parent_returns(key, layout):
    """A subset of ``out_indices`` returns those units' maps of the model with every unit out,
    of the shapes the parent returns."""
    family = FAMILIES[key]
    units = len(family.layouts[layout])
    chosen = tuple(range(1, units, 2))  # every other unit, the last one of four included
    every = built(family, layout, out_indices=tuple(range(units)))
    some = family.build(layout, out_indices=chosen)
    # the same weights (a per-output norm exists for the returned units only)
    some.load_state_dict({k: v for k, v in every.state_dict().items()
                          if k in some.state_dict()}, strict=True)
    x = images()
    everything, selected = outputs(every, x), outputs(some, x)
    assert len(everything) == units and len(selected) == len(chosen) < units
    for index, out in zip(chosen, selected):
        torch.testing.assert_close(out, everything[index], rtol=0, atol=0)
    parent = family.reference(out_indices=chosen)
    assert [o.shape for o in outputs(parent, x)] == [o.shape for o in selected]


def training_flags(model: nn.Module) -> Dict[str, bool]:
    """After ``train()``: each parameter's ``requires_grad`` and each module's ``training``."""
    model.train()
    return {**{f'param {n}': p.requires_grad for n, p in model.named_parameters()},
            **{f'module {n}': m.training for n, m in model.named_modules()}}


def as_the_reference_has_them(model: nn.Module, reference: nn.Module) -> Dict[str, bool]:
    """The flags ``model`` must have: the reference's, name by name. What a swap added (a
    mixer under ``<attention>.mixer``, no name of the reference) takes those of the stock
    attention it replaced, except that a layer of a type the reference put in eval outside its
    frozen units (``norm_eval``'s norm layers) is in eval too."""
    expected = training_flags(reference)
    modules = dict(reference.named_modules())
    frozen_units = {name for name, m in modules.items() if not m.training and any(
        not p.requires_grad for p in m.parameters())}
    eval_types = {type(m) for name, m in modules.items()
                  if not m.training and list(m.parameters(recurse=False)) and not any(
                      name == unit or name.startswith(f'{unit}.') for unit in frozen_units)}
    slots = getattr(model, 'swapped_names', {})
    own = dict(model.named_modules())
    flags = {}
    for key in training_flags(model):
        kind, name = key.split(' ', 1)
        if key in expected:
            flags[key] = expected[key]
            continue
        slot = next(s for s in slots if name.startswith(f'{s}.'))
        of_slot = {v for k, v in expected.items() if k.startswith(f'{kind} {slot}.')
                   or k == f'{kind} {slot}'}
        assert len(of_slot) == 1, (key, of_slot)
        flags[key] = of_slot.pop() and not (kind == 'module' and type(own[name]) in eval_types)
    return flags


@pytest.mark.parametrize('key,layout,arg', [
    param for arg in PARENT_ARGS for param in family_params(
        'freezing', where=lambda family, arg=arg: family.parent_defines(arg), extra=(arg,))])
def test_freezing_arguments_mean_what_they_mean_in_the_parent(key, layout, arg):
    """``frozen_stages`` / ``frozen_exclude`` / ``norm_eval``, where the parent defines them:
    after ``train()`` every parameter's ``requires_grad`` and every module's ``training`` are
    the parent's with the same argument, and a swapped mixer takes those of the attention it
    replaced (a parent that freezes in ``__init__`` freezes before the swap adds the mixers)."""
    family = FAMILIES[key]
    value = PARENT_ARGS[arg]
    model = family.build(layout, **{arg: value})
    flags = training_flags(model)
    assert flags == as_the_reference_has_them(model, family.reference(**{arg: value}))
    assert flags != training_flags(family.build(layout))  # the argument changes something


@pytest.mark.parametrize('key,layout', family_params(
    'with-cp', where=lambda family: family.parent_defines('with_cp')))
def test_with_cp_recomputes_the_blocks_and_changes_no_number(key, layout):
    family = FAMILIES[key]
    plain = built(family, layout)
    checkpointed = family.build(layout, with_cp=True)
    checkpointed.load_state_dict(plain.state_dict(), strict=True)
    calls = {}
    for label, model in (('plain', plain), ('with_cp', checkpointed)):
        calls[label] = []
        for name, module in model.named_modules():
            if name.endswith('.attn') and not name.rsplit('.', 2)[-2].endswith('attn'):
                module.register_forward_hook(lambda *_, log=calls[label]: log.append(1))
        model.train()
    x = images()
    out_plain, grads_plain = forward_backward(plain, plain, x)
    out_cp, grads_cp = forward_backward(checkpointed, checkpointed, x)
    for a, b in zip(out_cp, out_plain):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert len(grads_cp) == len(grads_plain)
    assert max(rel_err(a, b) for a, b in zip(grads_cp, grads_plain)) < 1e-5
    # each block's attention ran once more: the backward recomputed it
    assert calls['plain'] and len(calls['with_cp']) == 2 * len(calls['plain'])


# ---------------------------------------------------------------------------------- checkpoints
def backbone_file(state: Dict[str, torch.Tensor], path) -> str:
    """As mmseg/mmdet publish a backbone: a ``state_dict`` with ``backbone.`` keys."""
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in state.items()}}, path)
    return str(path)


@pytest.mark.parametrize('key,layout', family_params('round-trip'))
def test_its_weights_go_through_a_file_and_a_pretrained_checkpoint(key, layout, tmp_path):
    family = FAMILIES[key]
    saved = built(family, layout)
    state = through_a_file(saved)
    torch.manual_seed(1)  # other initial weights
    loaded = family.build(layout)
    assert list(state) == list(loaded.state_dict())
    loaded.load_state_dict(state, strict=True)
    x = images()
    for a, b in zip(outputs(saved, x), outputs(loaded, x)):
        assert torch.equal(a, b)
    path = backbone_file(saved.state_dict(), tmp_path / 'backbone.pth')
    pretrained = family.build(layout, init_cfg=dict(type='Pretrained', checkpoint=path))
    pretrained.init_weights()
    for name, value in pretrained.state_dict().items():
        assert torch.equal(value, state[name]), name


# where the mis-shaped tensor is: (the file's key, the model tensor that keeps its value)
MISSHAPED = {
    'swapped-attention': lambda keys: (keys.swapped_qkv, keys.swapped_into),
    'stock-attention': lambda keys: (keys.stock_proj, keys.stock_proj),
    'outside-attention': lambda keys: (keys.outside, keys.outside),
    'all-units-stock': lambda keys: (keys.outside, keys.outside),
}


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """One more input channel: the patch embedding of a 4-channel input, a wider q/k/v."""
    return torch.randn(tensor.shape[0], tensor.shape[1] + 1, *tensor.shape[2:])


def loaded_count(log: LogRecords) -> Tuple[int, int]:
    """``N of M`` of the loader's report line."""
    line, = [m for m in log.messages(logging.INFO) if ' tensors from ' in m]
    return tuple(map(int, re.search(r'(\d+) of (\d+) tensors from ', line).groups()))


@pytest.mark.parametrize('case', MISSHAPED)
@pytest.mark.parametrize('key', [key for key, family in FAMILIES.items() if family.checkpoint])
def test_a_mis_shaped_stock_checkpoint_raises_or_with_skip_keeps_its_initialisation(
        key, case, tmp_path):
    """A tensor of another shape than the model's raises, naming it, both shapes and the file,
    wherever it is (a swapped unit's attention, a kept stock unit's, outside the attention, a
    model whose units all keep the stock module); ``pretrained_mismatch='skip'`` loads the
    rest and keeps it as initialised."""
    family = FAMILIES[key]
    keys = family.checkpoint
    file_key, kept = MISSHAPED[case](keys)
    mixers = (KEEP_STOCK,) * len(keys.mixers) if case == 'all-units-stock' else keys.mixers
    file = family.reference().state_dict()
    expected, bad = tuple(file[file_key].shape), widened(file[file_key])
    file[file_key] = bad
    path = backbone_file(file, tmp_path / 'stock.pth')
    named = f'{file_key} {tuple(bad.shape)} vs model {expected}'
    init_cfg = dict(type='Pretrained', checkpoint=path)

    model = family.cls(**dict(family.kwargs, mixers=mixers, init_cfg=init_cfg))
    with pytest.raises(ValueError) as error:
        model.init_weights()
    assert named in str(error.value) and path in str(error.value), str(error.value)

    model = family.cls(**dict(family.kwargs, mixers=mixers, init_cfg=init_cfg,
                              pretrained_mismatch='skip'))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with LogRecords() as log:
        model.init_weights()
    state = model.state_dict()
    assert torch.equal(state[kept], initial[kept])  # skipped: as initialised
    assert not torch.equal(initial[keys.fitting], file[keys.fitting])
    assert torch.equal(state[keys.fitting], file[keys.fitting])  # the rest loaded
    assert any(named in m and path in m for m in log.messages(logging.WARNING))
    # everything the file holds for the model, less the new tensors and the skipped one
    new = 0 if case == 'all-units-stock' else keys.new
    assert loaded_count(log) == (len(state) - new - 1, len(state))


# ---------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('key,layout', family_params('modes'))
def test_fast_and_reference_modes_agree(key, layout, device):
    """``mode`` reaches every op with two paths (the mixers, and the backbone's own
    convolutions), and the two paths give the same outputs and parameter gradients."""
    family = FAMILIES[key]
    fast = built(family, layout, mode='fast').to(device)
    reference = family.build(layout, mode='reference').to(device)
    reference.load_state_dict(fast.state_dict(), strict=True)
    modes = [m.mode for m in reference.modules() if isinstance(getattr(m, 'mode', None), str)]
    assert set(modes) == {'reference'}
    # the modules the switch reaches: the backbone's own convolutions besides the mixers
    mixers = [m for m in fast.modules() if isinstance(m, MIXER_BASES)]
    assert len(modes) > len(mixers) + 1
    x = images(device)
    out_fast, grads_fast = forward_backward(fast, fast, x)
    out_ref, grads_ref = forward_backward(reference, reference, x)
    assert len(out_fast) == len(out_ref)
    for a, b in zip(out_fast, out_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert len(grads_fast) == len(grads_ref) > 10
    # float32 rounding, against the largest gradient (a conv bias before a BatchNorm has a true
    # gradient of zero: there the two paths differ by rounding alone)
    scale = max(g.abs().max() for g in grads_ref)
    worst = max(float((a - b).abs().max() / scale) for a, b in zip(grads_fast, grads_ref))
    assert worst < 1e-4, worst


# a stack of blocks under fp16 stays within about 1e-2 of float32 (measured: see the message)
NETWORK_FP16_TOL = 3e-2


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('key,layout', family_params('fp16'))
def test_fp16_autocast_is_finite_and_close_to_float32(key, layout, device):
    model = built(FAMILIES[key], layout).to(device)
    x = images(device)
    expected = outputs(model, x)
    dtypes = []
    hooks = [m.register_forward_hook(lambda _, __, out: dtypes.append(out.dtype))
             for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    with torch.autocast(device_type=device, dtype=torch.float16):
        actual = outputs(model, x)
    for hook in hooks:
        hook.remove()
    # the network really ran in fp16 (the output norms may hand back float32)
    assert dtypes and set(dtypes) == {torch.float16}, set(dtypes)
    assert len(actual) == len(expected)
    for stage, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape and torch.isfinite(a).all(), stage
        assert rel_err(a.float(), e) < NETWORK_FP16_TOL, (stage, rel_err(a.float(), e))


@pytest.mark.extended  # 5-15 s a case here: beyond make test's budget
@pytest.mark.parametrize('phase', ['train', 'infer'])
@pytest.mark.parametrize('key,layout', family_params('fullgraph'))
def test_it_compiles_as_one_graph(key, layout, phase):
    compiled_matches_eager(built(FAMILIES[key], layout), images(), train=phase == 'train')
