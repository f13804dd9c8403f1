"""The attention's step between state and readout for tokens split across ranks, in one process:
each part's sums plus the other part's (recorded in a first pass) stand for the all-reduce."""
import pytest
import torch

from nala_mm.ops import GlobalKeys, NaLaConfig, kernelized_attention, rope_table
from tests.helpers import rel_err


@pytest.mark.parametrize('mode', ['fast', 'reference'])
def test_split_tokens_attend_as_the_whole_set(mode):
    torch.manual_seed(0)
    height, width, head_dim = 6, 5, 8
    total = 1 + height * width  # a class token ahead of the grid
    q, k, v = (torch.randn(2, 2, total, head_dim) for _ in range(3))
    maps = NaLaConfig(kernel='cosine').feature_maps()
    cos, sin = rope_table(height, width, head_dim)
    rope = (torch.cat([torch.ones(1, cos.shape[1]), cos]),  # the class token: identity rows
            torch.cat([torch.zeros(1, sin.shape[1]), sin]))
    whole = kernelized_attention(q, k, v, *maps, rope=rope, mode=mode)

    # two 'ranks', each with the class token and its grid rows; the second leaves the class
    # token's key out of its sums
    cut = 1 + 3 * width
    parts = [(torch.arange(cut), 0), (torch.cat([torch.tensor([0]), torch.arange(cut, total)]), 1)]

    def attend(tokens, skip, reduce_sum):
        return kernelized_attention(q[..., tokens, :], k[..., tokens, :], v[..., tokens, :],
                                    *maps, rope=tuple(t[tokens] for t in rope), mode=mode,
                                    global_keys=GlobalKeys(total, skip, reduce_sum))

    own = []
    for tokens, skip in parts:
        attend(tokens, skip, lambda sums: own.append([s.detach() for s in sums]) or sums)
    for index, (tokens, skip) in enumerate(parts):
        other = own[1 - index]
        out = attend(tokens, skip, lambda sums: [s + o for s, o in zip(sums, other)])
        assert rel_err(out, whole[..., tokens, :]) < 1e-5, index
