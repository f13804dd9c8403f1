"""One switch means one thing: a mixer config that names another ``mode`` than its backbone, and
an unknown mode, are refused. That the switch reaches every op with two paths, and that the two
paths agree, is a contract of every mixer and backbone family (tests/contracts)."""
import pytest

from nala_mm.models import NaLaFormer
from nala_mm.models.swap import SegNaLaSwinTransformer
from tests.contracts.zoo import NALAFORMER, SWIN


def test_a_mixer_config_that_names_another_mode_is_refused():
    with pytest.raises(ValueError, match=r"mode='reference' inside a backbone built with "
                                         r"mode='fast'"):
        NaLaFormer(**NALAFORMER, mixers=(dict(type='NormAwareLinearAttention', mode='reference'),
                                         'nala', 'softmax', 'softmax'))
    with pytest.raises(ValueError, match="unknown mode 'quick'"):
        NaLaFormer(**NALAFORMER, mode='quick')
    with pytest.raises(ValueError, match="unknown mode 'quick'"):
        SegNaLaSwinTransformer(mode='quick', **SWIN)
