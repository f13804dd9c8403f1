"""RNGStateHook's choice of saved state per rank, when the world size changes."""
from nala_mm.engine.hooks.rng_state_hook import select_rng_state


def _rank_states(count):
    return {rank: dict(tag=rank) for rank in range(count)}


def test_rng_states_after_a_world_size_change_stay_distinct_and_warn():
    saved = dict(world_size=2, ranks=_rank_states(2))
    assert select_rng_state(saved, 1, 2, shared_stream=False) == (dict(tag=1), None)
    # grown to 3 ranks with per-rank seeds: ranks 0, 1 continue, rank 2 keeps its fresh seed
    picks = [select_rng_state(saved, rank, 3, shared_stream=False) for rank in range(3)]
    assert [state for state, _ in picks] == [dict(tag=0), dict(tag=1), None]
    warning = picks[2][1]
    assert 'world size 2' in warning and 'world size 3' in warning and 'ranks [2]' in warning
    # shrunk to 1 rank: it continues rank 0's stream, with the warning
    state, warning = select_rng_state(saved, 0, 1, shared_stream=False)
    assert state == dict(tag=0) and 'world size 1' in warning
    # diff_rank_seed=False: every rank draws one stream, so any saved state continues it exactly
    assert select_rng_state(saved, 2, 3, shared_stream=True) == (dict(tag=0), None)
