"""The per-step decisions (lbsgd.cadence.decide), hand-computed on a 10-step run: when a run
flushes its metrics, evaluates, checkpoints and stops. A pure function: no torch, no run."""

from lbsgd.cadence import Cadence, Decision, decide, log_steps

# 100 samples, batch 32: epochs after s steps = 0.32 s, so epochs end after steps 4 (1.28),
# 7 (2.24) and 10 (3.2, the last step).


def cadence(log_every=5, eval_every=2, checkpoint=True, checkpoint_every=3):
    return Cadence(10, log_every, eval_every, checkpoint, checkpoint_every, lambda s: s * 32 / 100)


def plan(flush=False, boundary=False, evaluate=False, checkpoint=False, stop=False, probe=False):
    return Decision(flush, boundary, evaluate, checkpoint, stop, probe)


def simulate(c):
    """The steps at which a loop following decide() flushes, evaluates and checkpoints."""
    flushes, evals, saves, pending = [], [], [], 0
    for done in range(1, c.total_steps + 1):
        pending += 1
        p = decide(c, done, pending)
        if p.flush:
            flushes.append(done)
            pending = 0
        evals += [done] * p.evaluate
        saves += [done] * p.checkpoint
    return flushes, evals, saves


def test_decide_does_nothing_after_the_first_step_of_an_epoch():
    assert decide(cadence(), 1, 1) == plan()
    assert decide(cadence(), 5, 1) == plan()


def test_decide_at_an_epoch_end_flushes_checkpoints_and_evaluates_every_eval_every_epochs():
    assert decide(cadence(), 4, 1) == plan(flush=True, boundary=True, checkpoint=True)  # epoch 1
    assert decide(cadence(), 7, 3) == plan(True, True, evaluate=True, checkpoint=True)  # epoch 2
    assert decide(cadence(eval_every=0), 7, 3) == plan(True, True, checkpoint=True)
    assert decide(cadence(checkpoint=False), 4, 1) == plan(flush=True, boundary=True)


def test_decide_at_the_last_step_evaluates_even_off_the_eval_cadence():
    want = plan(flush=True, boundary=True, evaluate=True, checkpoint=True)
    assert decide(cadence(), 10, 1) == want  # epoch 3: not a multiple of eval_every=2
    assert decide(cadence(eval_every=0), 10, 1) == want


def test_decide_flushes_every_log_every_steps():
    assert decide(cadence(), 5, 4) == plan()
    assert decide(cadence(), 5, 5) == plan(flush=True)


def test_a_checkpoint_between_flushes_forces_a_flush_where_the_models_agree():
    assert decide(cadence(), 6, 2) == plan(flush=True, checkpoint=True)
    assert decide(cadence(), 6, 2, in_sync=False) == plan()  # inside a local SGD block
    assert decide(cadence(checkpoint=False), 6, 2) == plan()
    assert decide(cadence(checkpoint_every=0), 6, 2) == plan()


def test_coinciding_cadences_give_one_flush_and_one_checkpoint():
    # step 4: an epoch end, a multiple of checkpoint_every=4 and of log_every=4 at once
    c = cadence(log_every=4, checkpoint_every=4)
    assert decide(c, 4, 4) == plan(flush=True, boundary=True, checkpoint=True)
    assert simulate(c) == ([4, 7, 8, 10], [7, 10], [4, 7, 8, 10])


def test_a_whole_run_flushes_before_every_checkpoint_and_evaluates_at_epoch_ends():
    assert simulate(cadence()) == ([3, 4, 6, 7, 9, 10], [7, 10], [3, 4, 6, 7, 9, 10])
    assert simulate(cadence(log_every=2, checkpoint_every=0)) == (
        [2, 4, 6, 7, 9, 10],
        [7, 10],
        [4, 7, 10],
    )


def test_a_stop_agreed_at_a_flush_stops_there_with_a_checkpoint_where_the_models_agree():
    assert decide(cadence(), 5, 5, stop_agreed=True) == plan(True, checkpoint=True, stop=True)
    assert decide(cadence(), 5, 5, in_sync=False, stop_agreed=True) == plan(True, stop=True)
    assert decide(cadence(checkpoint=False), 5, 5, stop_agreed=True) == plan(True, stop=True)
    # at an epoch end: its checkpoint is the stop's
    want = plan(True, True, evaluate=True, checkpoint=True, stop=True)
    assert decide(cadence(), 7, 3, stop_agreed=True) == want


def test_a_stop_agreed_at_the_last_step_completes_the_run():
    want = plan(flush=True, boundary=True, evaluate=True, checkpoint=True)
    assert decide(cadence(), 10, 1, stop_agreed=True) == want


def test_log_steps_are_the_ceilings_of_powers_of_two_to_the_jth_over_per_octave_each_once():
    # per_octave 2: ceil(2^(j/2)) = 1, 2 (1.414), 2, 3 (2.83), 4, 6 (5.66), 8, 12 (11.3), 16
    assert log_steps(16, 2) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert log_steps(5, 1) == [1, 2, 4]
    assert log_steps(100, 0) == []
    steps = log_steps(10_000, 4)
    # consecutive probes are 2^(1/4) apart in step, less the rounding up to an integer
    assert all(b / a <= 2**0.25 * (1 + 1 / a) for a, b in zip(steps, steps[1:], strict=False))


def test_a_probe_evaluates_the_held_out_split_at_log_steps_where_nothing_else_evaluates():
    c = Cadence(10, 5, 2, True, 3, lambda s: s * 32 / 100, frozenset(log_steps(10, 1)))
    assert decide(c, 2, 2) == plan(probe=True)
    assert decide(c, 8, 1) == plan(probe=True)
    assert decide(c, 5, 1) == plan()
    assert decide(c, 8, 1, in_sync=False) == plan()  # inside a local SGD block: no probe
    # step 4 ends epoch 1 (no evaluation at eval_every=2): a probe; step 10 is the full one
    assert decide(c, 4, 4) == plan(flush=True, boundary=True, checkpoint=True, probe=True)
    assert decide(c, 10, 2).probe is False and decide(c, 10, 2).evaluate is True


def test_each_pre_emption_signal_a_cluster_may_send_is_a_stop_request():
    """USR1 and USR2 (lbsgd.lab.experiments.slurm.SIGNALS, a cluster file's choice) are recorded as a
    request to stop at the next flush, not the process's end."""
    import os
    import signal

    from lbsgd.cadence import StopSignals
    from lbsgd.lab.experiments.slurm import SIGNALS

    for name in SIGNALS:
        with StopSignals() as stop:
            os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
        assert stop.caught == f"SIG{name}"
