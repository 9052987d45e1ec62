"""Simulated asynchronous SGD with bounded staleness: stale gradients, deterministically, on one machine.

In asynchronous SGD (a parameter server with workers that push gradients without a barrier; the
systems survey's stale-gradient workers) the gradient applied at server step t was computed on the
weights some τ steps old. Lian et al. 2015 ("Asynchronous parallel stochastic gradient for nonconvex
optimization", NeurIPS) analyse it with bounded staleness 0 ≤ τ ≤ τ_max. This module replays that
model exactly, with the trainer's synchronous loop:

    W_{t+1} = W_t − η_t · (momentum, weight decay, …)(∇L(W_{t−τ}; B_t))

where W_{t−τ} = W_0 while t < τ (the start of training: no older weights exist). Only the loss
gradient is stale: the optimizer steps W_t as at any step (its momentum buffer, the weight decay
λ·W_t, the LARS trust ratio of W_t and the learning rate η_t of the schedule at step t).

Keys (experiment keys: they change the mathematics):

- ``staleness`` = τ_max; 0 is synchronous SGD, and then nothing here runs (bitwise today's run).
- ``staleness_dist``: ``fixed`` — τ = τ_max for every gradient; the simulated worker is the whole
  step, so the run does not depend on the layout (processes × micro-batch × accumulation) beyond
  float reordering. ``uniform`` — τ is drawn uniformly from {0, …, τ_max} per simulated worker and
  step, from a hash of (seed, step, worker) (:func:`draw`), so a run is repeatable and resumes to
  the same draws. The simulated worker is then one micro-batch: worker j of step t is the j-th
  micro-batch of the global batch (rank · accum_steps + i), so the draws follow ``micro_batch``
  (the same micro-batch on any number of processes gives the same run; another micro-batch draws
  another set of τ).

Mechanics (:class:`StaleWeights`): a ring of τ_max + 1 copies of the parameters holds W_{t−τ_max}
… W_t. At the start of step t the current weights W_t enter the ring; each micro-batch loads
W_{t−τ} into the model for its forward and backward (its gradient accumulates into ``.grad`` as
usual, and DDP all-reduces it as usual: every process holds the same ring); W_t is loaded back
before the optimizer step. The ring is in the checkpoint, so a killed run resumes bitwise. Its size
is τ_max + 1 copies of the parameters, in memory and in each checkpoint: fine at the studies'
scales (τ_max = 8: about 10 MB for a ResNet-20, about 0.9 GB for a ResNet-50).

BN: a stale forward pass normalises its batch with its own statistics (training mode, as any
forward), and the running statistics accumulate the group statistics of those stale passes (what
the simulated workers computed), committed once per step as at τ = 0. The running statistics are
buffers, not parameters: they are not in the ring and are never rolled back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lbsgd.config import ConfigError

_MASK64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64's finaliser (Steele et al. 2014): a bijection of 64-bit integers."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def draw(seed: int, step: int, worker: int, tau_max: int) -> int:
    """τ ~ U{0, …, τ_max} of simulated worker ``worker`` at step ``step``: a pure function of
    (seed, step, worker), the same on any machine, process and after a resume. (64-bit hash
    modulo τ_max + 1: a bias below (τ_max + 1) / 2^64.)"""
    z = _mix(seed & _MASK64)
    z = _mix(z ^ (step & _MASK64))
    z = _mix(z ^ (worker & _MASK64))
    return z % (tau_max + 1)


class StaleWeights:
    """The ring W_{t−τ_max} … W_t of past parameters and the swaps of one step.

    Per step t: :meth:`begin` (W_t enters the ring), then for each micro-batch :meth:`use` (the
    model holds W_{t−τ} for its forward/backward), then :meth:`restore` (the model holds W_t again)
    before the optimizer step. Swaps are skipped when the model already holds the weights asked for
    (``fixed``: one load and one restore per step).
    """

    def __init__(self, params: Sequence[torch.Tensor], tau_max: int, dist: str, seed: int) -> None:
        if tau_max < 1:
            raise ValueError(f"tau_max={tau_max} must be >= 1 (0 is synchronous: no ring)")
        if dist not in ("fixed", "uniform"):
            raise ValueError(f"dist={dist!r} must be fixed or uniform")
        self.params = list(params)
        self.tau_max, self.dist, self.seed = tau_max, dist, seed
        # slot s holds W_step for step = held[s], step ≡ s (mod τ_max + 1); -1: nothing yet
        with torch.no_grad():
            self.slots = [[p.detach().clone() for p in self.params] for _ in range(tau_max + 1)]
        self.held = [-1] * (tau_max + 1)
        self.step = -1  # t: the step under way
        self.loaded = -1  # the step whose weights the model holds

    def tau(self, worker: int) -> int:
        """The staleness of ``worker``'s gradient at the current step."""
        if self.dist == "fixed":
            return self.tau_max
        return draw(self.seed, self.step, worker, self.tau_max)

    @torch.no_grad()
    def begin(self, step: int) -> None:
        """Step ``step`` starts: the model's weights are W_step; they enter the ring."""
        slot = step % (self.tau_max + 1)
        torch._foreach_copy_(self.slots[slot], self.params)
        self.held[slot] = step
        self.step = self.loaded = step

    def use(self, worker: int) -> int:
        """Load W_{t−τ} for ``worker``'s forward/backward (W_0 while t < τ); returns τ."""
        tau = self.tau(worker)
        self._load(max(self.step - tau, 0))
        return tau

    def restore(self) -> None:
        """Load W_t back: the optimizer steps the current weights with the stale gradient."""
        self._load(self.step)

    @torch.no_grad()
    def _load(self, source: int) -> None:
        if source == self.loaded:
            return
        slot = source % (self.tau_max + 1)
        if self.held[slot] != source:  # the ring's invariant; a broken resume would show here
            raise RuntimeError(
                f"staleness: the ring holds step {self.held[slot]} in slot {slot}, not {source}"
            )
        torch._foreach_copy_(self.params, self.slots[slot])
        self.loaded = source

    def state_dict(self) -> dict[str, Any]:
        """The ring as it is between steps (τ_max + 1 parameter copies and the step of each)."""
        return {"tau_max": self.tau_max, "held": list(self.held), "slots": self.slots}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any] | None, where: str = "the checkpoint") -> None:
        """The ring of :meth:`state_dict`; ConfigError (one line) if ``where`` holds none that fits
        (a checkpoint of a run without staleness, resumed by name with it)."""
        if not state or state.get("tau_max") != self.tau_max:
            saved = state.get("tau_max") if state else None
            raise ConfigError(
                f"staleness={self.tau_max}: {where} holds no ring of past weights for it "
                f"(saved: {saved if saved is not None else 'none'}); resume is refused"
            )
        for mine, saved in zip(self.slots, state["slots"], strict=True):
            torch._foreach_copy_(mine, [t.to(m.device) for t, m in zip(saved, mine, strict=True)])
        self.held = [int(s) for s in state["held"]]
