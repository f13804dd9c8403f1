"""The compile benchmark's size sequences (benchmarks/lib/recompiles.py) compile a bounded number
of graphs at full size. Here, beside the helper, since tests/ imports nothing from benchmarks/
(tests/ruff.toml); collected by make test through pytest.ini's testpaths."""
import pytest

from benchmarks.lib.recompiles import SIZE_SEQUENCES, count_compilations
from nala_mm.apis.compile import RECOMPILE_LIMIT
from tests.compile.test_recompiles import MAX_GRAPHS


@pytest.mark.extended
@pytest.mark.parametrize('name', list(SIZE_SEQUENCES))
def test_size_sequences_users_meet_compile_bounded_graphs(name):
    """Full-size models and sizes (random weights): ADE20K whole-image and slide inference,
    COCO's padded keep-ratio resizes, the ViT's interpolated position embedding."""
    counts = count_compilations(name)
    assert len(counts) == len(SIZE_SEQUENCES[name]['sizes'])
    # mmseg's ViT branches in Python on whether the patch embedding pads each side and whether
    # the position embedding needs resizing: at most 5 of those 8 cases occur
    bound = 5 if name.startswith('ViT') else MAX_GRAPHS
    assert counts[-1] <= bound <= RECOMPILE_LIMIT, counts
