"""lbsgd.seeding: each named seed stream gives exactly the integers its formula gives (a run's
digits depend on them), and streams that must not share seeds do not."""

import torch
from helpers import splitmix64

from lbsgd import config, data, seeding
from lbsgd.data import fake, sampler

SEEDS = (0, 1, 7, 42, (2**64 - 1) // 1_000_003)  # the last: about the largest a run may have
POSITIONS = [0, 1, 2, 31, 10**6, 2**40 + 3, 2**62]


def test_each_stream_is_its_formula_to_the_bit():
    assert config.SEED_STRIDE == 1_000_003
    for seed in SEEDS:
        for epoch in (0, 1, 89, 1_000_002):
            assert seeding.epoch_order(seed, epoch) == seed * 1_000_003 + epoch
        assert seeding.fake_train(seed) == 2 * seed
        assert seeding.fake_test(seed) == 2 * seed + 1
        assert seeding.initial_weights(seed) == seed  # the run seed itself, as committed runs were
        p = torch.tensor(POSITIONS)
        augmentation = seeding.augmentation(seed, p).tolist()
        assert augmentation == [splitmix64(2 * seed, x) for x in POSITIONS]
        assert all(0 <= s < 2**63 for s in augmentation)  # a seed torch's generators take
        assert seeding.micro_batches(seed, p).tolist() == [
            splitmix64(2 * seed + 1, x) for x in POSITIONS
        ]
    # a few values written out: a change of formula shows here even if the helper followed it
    assert seeding.augmentation(0, torch.tensor([0, 1])).tolist() == [
        splitmix64(0, 0),
        splitmix64(0, 1),
    ]
    assert seeding.epoch_order(3, 2) == 3_000_011
    assert seeding.sample_seeds(3, torch.tensor([], dtype=torch.int64)).tolist() == []
    # the held-out split's permutation: one constant, whatever the run seed
    assert seeding.held_out() == seeding.HOLDOUT_SEED == 1_000_002
    assert (seeding.fake_train(5), seeding.fake_test(5)) == (10, 11)


def test_the_data_package_uses_the_streams():
    """data.sample_seeds is the streams' SplitMix64; the sampler's epoch order and the fake
    dataset's splits are drawn from their streams' seeds."""
    assert data.sample_seeds is seeding.sample_seeds
    g = torch.Generator().manual_seed(seeding.epoch_order(4, 3))
    assert torch.equal(sampler.permutation(50, 4, 3), torch.randperm(50, generator=g))
    g = torch.Generator().manual_seed(seeding.held_out())
    assert torch.equal(
        data.holdout_indices(50, 7)[0], torch.randperm(50, generator=g)[:7].sort()[0]
    )
    x_tr, y_tr, x_te, y_te = fake.splits.__wrapped__(6, 4, 8, 5, 3)
    assert torch.equal(fake.images(6, 8, 5, seeding.fake_train(3))[0], x_tr)
    assert torch.equal(fake.images(4, 8, 5, seeding.fake_test(3))[1], y_te)


def test_streams_that_must_differ_do_not_collide():
    """For the same run seed: the fake dataset's splits are independent draws, a step's dropout
    never reuses a sample's augmentation seed, and each (seed, epoch) has its own data order (for
    every epoch below the stride), none of them the held-out split's permutation (seed 0's epoch
    1,000,002 would be)."""
    positions = torch.arange(10_000)
    for seed in SEEDS:
        assert seeding.fake_train(seed) != seeding.fake_test(seed)
        aug = set(seeding.augmentation(seed, positions).tolist())
        assert aug.isdisjoint(seeding.micro_batches(seed, positions).tolist())
        assert len(aug) == len(positions)
    orders = {seeding.epoch_order(s, e) for s in range(20) for e in range(50)}
    assert len(orders) == 20 * 50
    assert seeding.held_out() not in orders
    # the train split of one seed is never the test split of another: even and odd
    trains = {seeding.fake_train(s) for s in range(100)}
    assert trains.isdisjoint(seeding.fake_test(s) for s in range(100))
