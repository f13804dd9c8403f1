"""A mixer registered later gets every mixer contract with no test edited. Registering inside a
test is too late (the contracts are enumerated at collection) and a second registration
raises, so a pytest run of its own collects them: its ``conftest.py``, in a scratch folder,
registers a throwaway kernelised mixer (``relu(x)^2`` features, a map the package does not ship),
and ``-k`` with its name runs its contracts, alone and inside NaLaFormer."""
import re
import subprocess

import pytest

from tests.helpers import PYTHON, REPO, tool_env

pytestmark = pytest.mark.integration

CONFTEST = '''
from nala_mm.models import KernelizedMixer
from nala_mm.registry import register_model
from tests.helpers import SquaredReLU


@register_model
class ThrowawaySquaredReLUAttention(KernelizedMixer):

    def __init__(self, embed_dims, num_heads, eps=1e-6, **kwargs):
        super().__init__(embed_dims, num_heads, SquaredReLU(), SquaredReLU(), eps, **kwargs)
'''


def test_a_mixer_registered_in_a_conftest_is_collected_and_passes_its_contracts(tmp_path):
    (tmp_path / 'conftest.py').write_text(CONFTEST)
    # the suite's own conftest first (it prepares the imports), then the scratch one
    proc = subprocess.run(
        [PYTHON, '-m', 'pytest', 'tests/contracts/test_mixers.py', str(tmp_path), '-q',
         '-p', 'no:cacheprovider', '-m', 'not e2e and not extended', '-k',
         'ThrowawaySquaredReLUAttention', '-rA'],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=tool_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = re.findall(r'^PASSED \S+\[(ThrowawaySquaredReLUAttention-default-\S+)\]',
                        proc.stdout, re.M)
    # every contract of test_mixers.py, in both contexts (fullgraph in NaLaFormer: extended)
    contracts = {'test_it_builds_and_trains_at_odd_sizes', 'test_fast_and_reference_agree_'
                 'forward_and_backward', 'test_autocast_stays_finite_and_close_to_float32',
                 'test_it_compiles_as_one_graph',
                 'test_its_weights_go_through_a_file_and_a_strict_load'}
    ran = set(re.findall(r'^PASSED \S+::(\w+)\[ThrowawaySquaredReLUAttention', proc.stdout,
                         re.M))
    assert ran == contracts, proc.stdout[-3000:]
    assert {p.split('-')[2] for p in passed} == {'alone', 'nalaformer'}
    # fast/reference, odd sizes, round trip on the CPU in both contexts, fp16 and bf16 in both,
    # fullgraph alone in training and inference
    assert len(passed) == 3 * 2 + 2 * 2 + 2, passed
