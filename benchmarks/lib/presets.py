"""The token mixers the studies compare (ablation.py on the demo data,
projects/longrange/study.py): a label for the tables and the mixer every stage gets.

A mixer with an ADE20K ablation config (``configs/ablation/ade20k_nala-t_upernet_<name>.py``) is
read from that config, its one home; the mixers compared on generated data only are written here.
"""
import ast
import os.path as osp
from dataclasses import dataclass
from typing import Dict

from .paths import REPO


@dataclass(frozen=True)
class MixerPreset:
    """A named mixer of the comparisons: a label for tables and the config every stage gets."""
    label: str
    mixer: dict


def ablation_mixer(name: str) -> dict:
    """The one mixer ``configs/ablation/ade20k_nala-t_upernet_<name>.py`` gives all four stages
    (its ``mixers=`` expression evaluated with ``dict`` alone; the config inherits everything
    else, and reading the whole config would resolve its bases)."""
    path = osp.join(REPO, 'configs', 'ablation', f'ade20k_nala-t_upernet_{name}.py')
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    node, = [k.value for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == 'mixers']
    mixers = eval(compile(ast.Expression(node), path, 'eval'), {'__builtins__': {}, 'dict': dict})
    if len(mixers) != 4 or any(m != mixers[0] for m in mixers):
        raise ValueError(f'{path}: an ablation config gives one mixer to all four stages, got '
                         f'{mixers}')
    return mixers[0]


_ABLATION_LABELS = {
    'nala-cosine': "NaLa, paper's cosine kernel",
    'nala-relu': 'NaLa, released ReLU kernel',
    'nala-fixed-power': 'NaLa without norm awareness (cosine kernel, p = 3)',
    'nala-positive': 'NaLa, positive-only kernel',
    'linear-relu': 'plain linear attention (ReLU)',
}
PRESETS: Dict[str, MixerPreset] = {
    **{name: MixerPreset(label, ablation_mixer(name)) for name, label in _ABLATION_LABELS.items()},
    'linear-elu': MixerPreset('plain linear attention (1 + ELU)',
                              dict(type='LinearAttention', feature_map='elu')),
    'softmax': MixerPreset('softmax attention', ablation_mixer('softmax')),
    'identity': MixerPreset('control: no token mixing', dict(type='IdentityAttention')),
    # an exponent that stays responsive where tanh ||q|| saturates (projects/longrange/README.md)
    'nala-rms': MixerPreset('NaLa, exponent reads ‖q‖/√d (cosine kernel)',
                            dict(type='NormAwareLinearAttention', kernel='cosine',
                                 query_norm='rms')),
}
