"""Goyal §3 data shuffling: one shuffle per epoch, split across the workers, every sample once."""

from collections import Counter

import pytest
import torch

from lbsgd.data import StepSampler, shard


def rank_stream(n, batch, micro, world, steps, seed=0, start=0):
    return [
        StepSampler(
            num_samples=n,
            batch_size=batch,
            micro_batch=micro,
            rank=r,
            world_size=world,
            seed=seed,
            total_steps=steps,
            start_step=start,
        )
        for r in range(world)
    ]


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize(("n", "batch"), [(1000, 64), (96, 32), (50, 64)])
def test_every_sample_handed_out_exactly_once_per_epoch_across_workers(world, n, batch):
    micro = 8
    epochs = 5
    steps = -(-epochs * n // batch)
    samplers = rank_stream(n, batch, micro, world, steps)
    used: list[int] = []
    for step in range(steps):
        for s in samplers:  # all ranks' micro-batches of this step
            for idx in s.rank_batches(step):
                assert len(idx) == micro  # every micro-batch is full
                used.extend(idx.tolist())
    assert len(used) == steps * batch
    for e in range(epochs):  # the stream's e-th block of n samples is a permutation of 0..n-1
        assert sorted(used[e * n : (e + 1) * n]) == list(range(n)), e


def test_ranks_split_each_global_batch_without_overlap():
    samplers = rank_stream(1000, 64, 8, 4, steps=20)
    for step in range(20):
        parts = [torch.cat(s.rank_batches(step)) for s in samplers]
        joined = torch.cat(parts)
        assert torch.equal(joined, samplers[0].global_batch(step))
        assert len(set(joined.tolist())) == 64


def test_micro_batches_do_not_depend_on_the_number_of_workers():
    # 1 process accumulating 8 micro-batches sees exactly what 4 processes x 2 micro-batches see
    one = rank_stream(1000, 64, 8, 1, steps=30)[0]
    four = rank_stream(1000, 64, 8, 4, steps=30)
    for step in range(30):
        flat = [b.tolist() for s in four for b in s.rank_batches(step)]
        assert flat == [b.tolist() for b in one.rank_batches(step)]


def test_each_epoch_is_a_new_shuffle_and_the_seed_fixes_it():
    a = rank_stream(100, 100, 10, 1, steps=2, seed=0)[0]
    b = rank_stream(100, 100, 10, 1, steps=2, seed=0)[0]
    c = rank_stream(100, 100, 10, 1, steps=2, seed=1)[0]
    assert torch.equal(a.global_batch(0), b.global_batch(0))
    assert not torch.equal(a.global_batch(0), a.global_batch(1))
    assert not torch.equal(a.global_batch(0), c.global_batch(0))


def test_starting_at_a_step_continues_the_same_stream():
    whole = list(rank_stream(1000, 64, 8, 2, steps=40)[1])
    resumed = list(rank_stream(1000, 64, 8, 2, steps=40, start=17)[1])
    accum = 64 // (2 * 8)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in whole[17 * accum :]]
    assert len(resumed) == (40 - 17) * accum


def test_evaluation_shards_cover_the_split_exactly_once():
    for world in (1, 2, 3, 7):
        counts = Counter(i for r in range(world) for i in shard(1001, r, world))
        assert sorted(counts) == list(range(1001)) and set(counts.values()) == {1}


def test_impossible_mapping_is_refused():
    with pytest.raises(ValueError, match="not a multiple of world_size"):
        StepSampler(
            num_samples=1000,
            batch_size=100,
            micro_batch=8,
            rank=0,
            world_size=2,
            seed=0,
            total_steps=1,
        )
