"""Attention transfer: train the NaLa mixers of a swapped stock backbone to reproduce what its
softmax-trained original computes, without labels, before any fine-tuning (``tools/linearize.py``,
docs/user_guides/linearize.md).

The *teacher* is the swapped backbone's stock parent, built with the same arguments (minus
``mixers``) and holding the stock checkpoint's weights, frozen; for a checkpoint trained in a
layout of mixers of its own (ViTDet's windows), the backbone of the config it was trained with
(:func:`load_swapped_teacher`, ``tools/linearize.py --teacher-config``). The *student* is the
swapped backbone with those weights carried over
(:meth:`SwappedAttentionMixin.carry_over_checkpoint`). Both see the same images; only the
student's swapped mixers train, everything else keeps the teacher's values (both run in eval
mode: BatchNorm statistics and dropout as trained).

What a swapped block is trained to reproduce, and how (:class:`TransferOptions`):

* ``target``: the block's output (``'block'``), or its attention module's (``'attention'``);
* ``inputs``: each block fed the teacher's input to it (``'teacher'``: blocks train
  independently, nothing upstream drifts), or the student running in sequence on its own
  outputs (``'sequence'``: later blocks correct earlier ones' errors);
* ``params``: every mixer parameter, the carried q/k/v and output projection included
  (``'mixer'``), or only what the swap added (``'new'``: the gate rows ``qkvg[3C:]``, LePE and
  the mixer's LayerNorm);
* the loss is the mean squared error normalised by the teacher's mean square per block (a
  relative error, so blocks of every scale weigh alike), Adam at ``lr``, no weight decay.

The defaults are what ``benchmarks/studies/linearize_choices.py`` measured on a small Swin
(docs/user_guides/linearize.md, "The choices, measured"): the block's output as the target, the
student in sequence, every mixer parameter (the carried q/k/v move too) and lr 1e-3.
"""
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Tuple

import torch
from mmengine.logging import print_log
from torch import Tensor, nn

from ..models.swap.base import SwappedAttentionMixin

TARGETS = ('block', 'attention')
INPUTS = ('teacher', 'sequence')
PARAMS = ('mixer', 'new')


@dataclass(frozen=True)
class TransferOptions:
    """How the mixers are trained (module docstring)."""
    iters: int = 200
    lr: float = 1e-3
    target: str = 'block'
    inputs: str = 'sequence'
    params: str = 'mixer'

    def __post_init__(self):
        for name, allowed in (('target', TARGETS), ('inputs', INPUTS), ('params', PARAMS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f'attention transfer: {name} must be one of {allowed}, got '
                                 f'{getattr(self, name)!r}')
        if self.iters < 0 or not self.lr > 0:
            raise ValueError(f'attention transfer needs iters >= 0 and lr > 0, got '
                             f'iters={self.iters}, lr={self.lr}')


# ------------------------------------------------------------------------------ the two models
def swapped_blocks(student: SwappedAttentionMixin) -> List[str]:
    """The names of the student's blocks whose attention was swapped (``'stages.0.blocks.1'``),
    in forward order; the teacher has the same names."""
    if not isinstance(student, SwappedAttentionMixin):
        raise TypeError(f'attention transfer needs a stock backbone with NaLa swapped in '
                        f'(nala_mm.models.swap), got {type(student).__name__}')
    names = [name.rsplit('.', 1)[0] for name in student.swapped_names]
    if not names:
        raise ValueError(f'{type(student).__name__} has no swapped block: its mixers are '
                         f'{student.mixers}; name a NaLa mixer (e.g. "nala") for at least one '
                         f'{student.mixer_unit}')
    return names


def build_teacher(student: SwappedAttentionMixin, backbone_cfg: Mapping) -> nn.Module:
    """The student's stock parent with the config's arguments minus the swap's own (and
    without any pretrained initialisation: the weights come from the checkpoint)."""
    kwargs = {k: v for k, v in backbone_cfg.items() if k not in (
        'type', 'mixers', 'mode', 'pretrained_mismatch', 'init_cfg', 'pretrained')}
    return student.stock_parent()(**kwargs)


def load_swapped_teacher(teacher: SwappedAttentionMixin, checkpoint: Mapping,
                         source: str) -> None:
    """Load a checkpoint into a teacher that is itself a swapped backbone (ViTDet's windows,
    built from the config the checkpoint was trained with): every tensor must fit."""
    state, _ = teacher.carry_over_checkpoint(checkpoint, source)
    own = teacher.state_dict()
    missing = [k for k in own if k not in state]
    if missing:
        raise ValueError(f'{source} is not a checkpoint of the teacher config\'s backbone: '
                         f'{len(missing)} of its {len(own)} tensors missing (first: '
                         f'{missing[:4]})')
    teacher.load_state_dict({k: state[k] for k in own}, strict=True)


def load_teacher(teacher: nn.Module, student: SwappedAttentionMixin, checkpoint: Mapping,
                 source: str) -> None:
    """Load the stock checkpoint into the teacher, read as the student's family reads it (the
    parent's converter, position tables resized). Raises when it is not a checkpoint of this
    stock backbone: a teacher tensor missing or of another shape."""
    own = teacher.state_dict()
    state = student.adapt_state(student.upstream_state(checkpoint), own)
    missing = [k for k in own if k not in state]
    shapes = [f'{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}' for k in own
              if k in state and state[k].shape != own[k].shape]
    if missing or shapes:
        parent = type(teacher)
        raise ValueError(
            f'{source} is not a checkpoint of the stock model of this config '
            f'({parent.__module__}.{parent.__name__} with its arguments): '
            + (f'{len(missing)} of its {len(own)} tensors missing (first: {missing[:4]})'
               if missing else '') + ('; ' if missing and shapes else '')
            + (f'mis-shaped: {shapes[:4]}' if shapes else '')
            + '. Linearize converts a softmax-trained stock model: pass its checkpoint, not a '
              'swapped one.')
    teacher.load_state_dict({k: state[k] for k in own}, strict=True)


def trainable_parameters(student: SwappedAttentionMixin, params: str
                         ) -> Tuple[List[nn.Parameter], list]:
    """Freeze the student but for its swapped mixers: all of a mixer's parameters, or only what
    the swap added (the gate rows of ``qkvg``, LePE and ``ln``; a gradient hook keeps the
    carried q/k/v rows). Returns the parameters and the hooks' handles (remove them after)."""
    for p in student.parameters():
        p.requires_grad_(False)
    chosen, handles = [], []
    for block in swapped_blocks(student):
        mixer = student.get_submodule(f'{block}.attn.mixer')
        for name, p in mixer.named_parameters():
            if params == 'new' and name.startswith('out_proj.'):
                continue
            p.requires_grad_(True)
            if params == 'new' and name.startswith('qkvg.'):
                carried = 3 * mixer.embed_dims  # q | k | v rows came from the checkpoint
                handles.append(p.register_hook(lambda grad, rows=carried: torch.cat(
                    [grad[:rows].new_zeros(grad[:rows].shape), grad[rows:]])))
            chosen.append(p)
    return chosen, handles


# ------------------------------------------------------------------------------ what is compared
@contextmanager
def recording(model: nn.Module, modules: Iterable[str], inputs: bool = False
              ) -> Iterator[Dict[str, tuple]]:
    """While active, ``record[name]`` holds ``(args, kwargs, output)`` (or only ``output``) of
    the last call of each named submodule."""
    record: Dict[str, tuple] = {}

    def keep(name):
        def hook(module, args, kwargs, output):
            record[name] = (args, kwargs, output) if inputs else (output,)
        return hook

    handles = [model.get_submodule(name).register_forward_hook(keep(name), with_kwargs=True)
               for name in modules]
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()


def first_tensor(output) -> Tensor:
    """A block's output tensor (Swin's stages and blocks return tensors; some return tuples)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def relative_l2(actual: Tensor, expected: Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


def relative_mse(actual: Tensor, expected: Tensor) -> Tensor:
    """Mean squared error over the teacher's mean square: scale-free per block."""
    return (actual - expected).square().mean() / expected.square().mean().clamp_min(1e-12)


def module_names(blocks: List[str], target: str) -> List[str]:
    return [f'{b}.attn' for b in blocks] if target == 'attention' else list(blocks)


@torch.no_grad()
def errors(teacher: nn.Module, student: SwappedAttentionMixin, batches: List[Tensor]
           ) -> Dict[str, Dict[str, float]]:
    """Relative L2 errors of the student against the teacher on ``batches``, each model on its
    own inputs (the deployed condition): per swapped block (its output), and per returned
    feature map (``features.{i}``), pooled over the batches."""
    blocks = swapped_blocks(student)
    sums: Dict[str, List[float]] = {}

    def add(key, actual, expected):
        diff = (actual.double() - expected.double()).square().sum().item()
        norm = expected.double().square().sum().item()
        total = sums.setdefault(key, [0.0, 0.0])
        total[0] += diff
        total[1] += norm

    for images in batches:
        with recording(teacher, blocks) as theirs, recording(student, blocks) as ours:
            expected, actual = teacher(images), student(images)
        for block in blocks:
            add(block, first_tensor(ours[block][0]), first_tensor(theirs[block][0]))
        for i, (a, e) in enumerate(zip(actual, expected)):
            add(f'features.{i}', first_tensor(a), first_tensor(e))
    return {key: (diff / norm) ** 0.5 for key, (diff, norm) in sums.items()}


# ------------------------------------------------------------------------------ the transfer
def attention_transfer(teacher: nn.Module, student: SwappedAttentionMixin,
                       batches: Callable[[], Tensor], options: TransferOptions,
                       progress: bool = True) -> dict:
    """Train the student's swapped mixers for ``options.iters`` steps on images from
    ``batches()`` (a preprocessed batch per call) to reproduce the teacher; returns the losses
    and the seconds it took."""
    blocks = swapped_blocks(student)
    teacher.eval()
    student.eval()  # the teacher's BatchNorm statistics and no dropout: only the mixers change
    for p in teacher.parameters():
        p.requires_grad_(False)
    params, handles = trainable_parameters(student, options.params)
    optimizer = torch.optim.Adam(params, lr=options.lr)
    names = module_names(blocks, options.target)
    losses = []
    bar = None
    if progress:
        from mmengine.utils import ProgressBar
        bar = ProgressBar(options.iters)
    start = time.perf_counter()
    for _ in range(options.iters):
        images = batches()
        with torch.no_grad(), recording(teacher, names, inputs=True) as theirs:
            teacher(images)
        if options.inputs == 'teacher':
            student.before_blocks(images)
            loss = sum(relative_mse(first_tensor(
                student.get_submodule(name)(*theirs[name][0], **theirs[name][1])),
                first_tensor(theirs[name][2])) for name in names) / len(names)
        else:
            with recording(student, names) as ours:
                student(images)
            loss = sum(relative_mse(first_tensor(ours[name][0]), first_tensor(theirs[name][2]))
                       for name in names) / len(names)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if bar is not None:
            bar.update()
    if bar is not None:
        print()
    for handle in handles:
        handle.remove()
    for p in student.parameters():
        p.requires_grad_(True)
    return dict(losses=losses, seconds=time.perf_counter() - start, options=asdict(options))


def linearize(teacher: nn.Module, student: SwappedAttentionMixin,
              batches: Callable[[], Tensor], held_out: List[Tensor],
              options: TransferOptions, progress: bool = True) -> dict:
    """:func:`attention_transfer` with the errors before and after on ``held_out`` batches:
    the report's numbers (one entry per swapped block and per returned feature map)."""
    before = errors(teacher, student, held_out)
    run = attention_transfer(teacher, student, batches, options, progress)
    after = errors(teacher, student, held_out)
    units = {name.rsplit('.', 1)[0]: unit for name, unit in student.swapped_names.items()}
    rows = [dict(name=key, unit=units.get(key), rel_l2_before=before[key],
                 rel_l2_after=after[key]) for key in before]
    print_log(report_table(rows, run), logger='current')
    return dict(rows=rows, iters=options.iters, seconds=run['seconds'],
                final_loss=run['losses'][-1] if run['losses'] else None,
                options=run['options'], losses=run['losses'])


def report_table(rows: List[dict], run: dict) -> str:
    lines = [f'attention transfer: {len(run["losses"])} iterations in {run["seconds"]:.1f} s',
             f'{"block / feature map":<32} {"rel. L2 before":>15} {"after":>10}']
    lines += [f'{r["name"]:<32} {r["rel_l2_before"]:>15.4f} {r["rel_l2_after"]:>10.4f}'
              for r in rows]
    return '\n'.join(lines)


def split_whole_model(checkpoint: Mapping) -> Tuple[bool, Mapping]:
    """Whether a checkpoint holds a whole segmentor or detector (keys under ``backbone.``
    beside its heads) rather than a backbone alone, and its state dict."""
    from ..models.state_dicts import state_dict_of
    state = state_dict_of(checkpoint)
    backbone = [k for k in state if k.startswith('backbone.')]
    return bool(backbone) and len(backbone) < len(state), state

