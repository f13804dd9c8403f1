"""TokenParallel: one image's rows across gloo ranks give the one-process outputs and gradients.

The one-process reference is the same module, built from the same weights, run in the pytest
process without TokenParallel (no process group there: ``SyncBN`` runs as plain BatchNorm). The
ranks run it in train mode, with the statistics of every BatchNorm reduced over the group, each
backpropagating the loss of its own rows; the sum of their parameter gradients must be the
reference's. The sizes split unevenly: the last rank holds a short stripe.
"""
import copy

import pytest
import torch
import torch.distributed as dist

from nala_mm.models import NaLaFormer
from nala_mm.models.swap.vit import NaLaVisionTransformer
from nala_mm.parallel import TokenParallel
from nala_mm.parallel.stripes import split_rows
from tests.helpers import rel_err, run_ranks

NALAFORMER_STRIDES = (4, 8, 16, 32)
VIT_PATCH = 8


def nalaformer(with_cp: bool = False, mode: str = 'fast') -> NaLaFormer:
    """All kernelised (NaLa and plain linear), BatchNorm as the shipped configs select it.
    ``momentum=None``: after the one training step the running statistics are that batch's, so
    the inference that follows is as well scaled as training (with the default 0.1 they leave
    the late stages unnormalised, where float32 rounding alone reaches 4e-5 of one process's
    float64 output)."""
    return NaLaFormer(arch=dict(embed_dims=(16, 16, 24, 24), depths=(1, 1, 1, 1),
                                num_heads=(1, 1, 2, 2), mlp_ratios=(2, 2, 2, 2)),
                      mixers=('nala', 'linear', 'nala', 'nala'), drop_path_rate=0.0,
                      norm_cfg=dict(type='SyncBN', momentum=None), with_cp=with_cp, mode=mode)


def vit(mode: str = 'fast') -> NaLaVisionTransformer:
    """A class token, a position embedding of a 64x64 grid resized to the input's."""
    return NaLaVisionTransformer(img_size=(64, 64), patch_size=VIT_PATCH, embed_dims=32,
                                 num_layers=2, num_heads=2, mlp_ratio=2, out_indices=(0, 1),
                                 with_cls_token=True, final_norm=True, drop_rate=0.0,
                                 drop_path_rate=0.0, mixers=('nala', 'linear'), mode=mode)


BUILDERS = {
    'nalaformer': (nalaformer, {}, NALAFORMER_STRIDES),
    'nalaformer_cp': (nalaformer, dict(with_cp=True), NALAFORMER_STRIDES),
    'vit': (vit, {}, (VIT_PATCH,) * 2),
    'vit_reference': (vit, dict(mode='reference'), (VIT_PATCH,) * 2),
}


def _build(name: str):
    build, kwargs, strides = BUILDERS[name]
    return build(**kwargs), strides


def _grads(model):
    return {n: (torch.zeros_like(p) if p.grad is None else p.grad.clone())
            for n, p in model.named_parameters()}


def _statistics(model):
    return {n: b.clone() for n, b in model.named_buffers() if 'running' in n}


def one_process_case(name: str, shape, path) -> None:
    """The reference run, saved for the ranks: weights, input, loss weights, outputs, gradients
    and running statistics after one training forward."""
    torch.manual_seed(0)
    model, _ = _build(name)
    state = copy.deepcopy(model.state_dict())
    model.train()
    x = torch.randn(shape)
    outs = list(model(x))
    weights = [torch.randn_like(o) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    with torch.no_grad():  # inference takes other paths (the FFN's, BatchNorm's)
        inferred = list(model.eval()(x))
    torch.save(dict(state=state, x=x, weights=weights, outs=[o.detach() for o in outs],
                    grads=_grads(model), statistics=_statistics(model), inferred=inferred),
               path)


def compare_with_one_process(rank: int, world: int, name: str, path: str) -> dict:
    """One case on this rank: the errors of the gathered outputs, the summed gradients and the
    running statistics against the one-process run's, whether the ranks' statistics agree, and
    the errors of the inference that follows (eval mode, no gradients, given only this rank's
    rows)."""
    case = torch.load(path)
    model, strides = _build(name)
    model.load_state_dict(case['state'])
    model.train()
    tp = TokenParallel(model)
    x = case['x']
    start = tp.stripes(x.shape[2]).bounds[rank][0]
    outs = list(tp(x))
    # this rank's rows' share of the one-process loss
    sum((o * w[:, :, start // s:start // s + o.shape[2]]).sum()
        for o, w, s in zip(outs, case['weights'], strides)).backward()
    with torch.no_grad():
        gathered = tp.gather([o.detach() for o in outs])
    grads = _grads(model)
    for grad in grads.values():
        dist.all_reduce(grad)
    # a conv bias before a train-mode BatchNorm has no effect, its gradient is zero in exact
    # arithmetic: measured against the largest gradient (its float noise), the others relatively
    scale = max(g.norm() for g in case['grads'].values())
    vanishing = {n for n, g in case['grads'].items() if g.norm() < 1e-6 * scale}
    names = [n for n in case['grads'] if n not in vanishing]
    statistics = _statistics(model)
    agree = []
    for n, own in statistics.items():
        everyone = [torch.empty_like(own) for _ in range(world)]
        dist.all_gather(everyone, own)
        agree.append(all(torch.equal(e, own) for e in everyone))
    start, stop = tp.stripes(x.shape[2]).bounds[rank]
    with torch.no_grad():  # from this rank's rows alone
        inferred = tp.gather(list(tp.eval()(x[:, :, start:stop], stripe=True,
                                            image_rows=x.shape[2])))
    return dict(
        inferred=[rel_err(g, e) for g, e in zip(inferred, case['inferred'])],
        rows=[o.shape[2] for o in outs],
        outputs=[rel_err(g, e) for g, e in zip(gathered, case['outs'])],
        grads={n: rel_err(grads[n], case['grads'][n]) for n in names},
        vanishing={n: (grads[n].norm() / scale).item() for n in vanishing},
        statistics=[rel_err(statistics[n], e) for n, e in case['statistics'].items()],
        statistics_agree=all(agree))


def refusals(rank: int, world: int) -> dict:
    """The messages of the sizes a 2-rank group cannot split."""
    tp = TokenParallel(nalaformer())
    messages = {}
    for what, args, kwargs in [('one_block', (torch.randn(1, 3, 32, 64),), {}),
                               ('three_blocks', (torch.randn(1, 3, 96, 64),), {}),
                               ('wrong_stripe', (torch.randn(1, 3, 10, 64),),
                                dict(stripe=True, image_rows=128))]:
        with pytest.raises(ValueError) as error:
            tp(*args, **kwargs)
        messages[what] = str(error.value)
    return messages


def run_cases(rank: int, world: int, cases, directory: str) -> None:
    """Every case of one group size in one set of processes (starting them is most of the
    time); rank 0 saves what each case measured."""
    results = {name: compare_with_one_process(rank, world, name, f'{directory}/{name}.pt')
               for name, _ in cases}
    if world == 2:
        results['refusals'] = refusals(rank, world)
    if rank == 0:
        torch.save(results, f'{directory}/results.pt')


CASES = {  # ranks: (name, input shape), the rows splitting unevenly
    2: [('vit', (2, 3, 100, 72)),            # 13 patch rows: 7 and 6 (the last 4 rows short)
        ('nalaformer', (2, 3, 100, 72)),     # 4 blocks of 32 rows: 64 and 36 rows
        ('nalaformer_cp', (2, 3, 100, 72))],  # the same, each block recomputed in the backward
    3: [('nalaformer', (1, 3, 200, 64)),     # 7 blocks: 96, 64 and 40 rows
        ('vit_reference', (1, 3, 100, 64))],  # 5, 4 and 4 patch rows; the reference mode
}


@pytest.fixture(scope='module')
def measured(tmp_path_factory):
    """Per group size, what every case measured (run on first use)."""
    done = {}

    def of(ranks: int) -> dict:
        if ranks not in done:
            directory = tmp_path_factory.mktemp(f'ranks{ranks}')
            for name, shape in CASES[ranks]:
                one_process_case(name, shape, str(directory / f'{name}.pt'))
            run_ranks(run_cases, ranks, directory, CASES[ranks], str(directory))
            done[ranks] = torch.load(directory / 'results.pt')
        return done[ranks]
    return of


@pytest.mark.integration
@pytest.mark.parametrize('ranks,name', [(r, n) for r, cases in CASES.items() for n, _ in cases],
                         ids=[f'{n}-{r}ranks' for r, cases in CASES.items() for n, _ in cases])
def test_token_parallel_matches_one_process(measured, ranks, name):
    result = measured(ranks)[name]
    assert max(result['outputs']) < 1e-5, result['outputs']
    worst = max(result['grads'].items(), key=lambda item: item[1])
    assert worst[1] < 1e-4, worst
    assert not result['vanishing'] or max(result['vanishing'].values()) < 1e-6, result['vanishing']
    assert not result['statistics'] or max(result['statistics']) < 1e-5, result['statistics']
    assert result['statistics_agree']
    assert max(result['inferred']) < 1e-5, result['inferred']


@pytest.mark.integration
def test_token_parallel_refuses_sizes_it_cannot_split(measured):
    messages = measured(2)['refusals']
    assert messages['one_block'].startswith('more ranks (2) than row blocks (1): an image of '
                                            '32 rows is 1 blocks of 32 rows'), messages
    assert messages['three_blocks'].startswith(
        'an image of 96 rows is too small to split across 2 ranks: it is 3 blocks of 32 rows, '
        'and each rank needs 2'), messages
    assert messages['wrong_stripe'] == ('rank 0 holds rows 0..63 of an image of 128 rows '
                                        '(64 rows), got an input of 10 rows'), messages


def test_token_parallel_refuses_softmax_and_window_mixers():
    hybrid = NaLaFormer(arch=dict(embed_dims=(16,) * 4, depths=(1,) * 4, num_heads=(1,) * 4),
                        mixers=('nala', 'nala', 'softmax', 'softmax'))
    with pytest.raises(ValueError, match=r"stage 3 has SoftmaxAttention \(mixers entry "
                                         r"'softmax'\)"):
        TokenParallel(hybrid)
    windowed = NaLaVisionTransformer(img_size=(64, 64), patch_size=16, embed_dims=32,
                                     num_layers=3, num_heads=2, mixers=('nala', 'window', 'nala'))
    with pytest.raises(ValueError, match=r"layer 1 has .*\(mixers entry 'window'\)"):
        TokenParallel(windowed)
    with pytest.raises(TypeError, match='NaLaFormer or a NaLaVisionTransformer, got Linear'):
        TokenParallel(torch.nn.Linear(2, 2))


def test_stripes_are_whole_blocks_in_rank_order():
    stripes = split_rows(200, 3, 32, 2)
    assert stripes.bounds == ((0, 96), (96, 160), (160, 200))
    assert split_rows(100, 2, 8, 2).bounds == ((0, 56), (56, 100))
