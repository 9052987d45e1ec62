"""Simulated asynchronous SGD with bounded staleness: stale gradients, deterministically, on one machine.

The update of step t applies the gradient computed on the weights of step t − τ (W_0 while t < τ)
to the current weights W_t; momentum, weight decay, the trust ratio and the lr act on W_t as at any
step (Lian et al. 2015's bounded-staleness model). ``staleness_dist=fixed`` takes τ = τ_max,
``uniform`` draws τ per micro-batch and step from a hash of (seed, step, worker) (:func:`draw`).
:class:`StaleWeights` keeps a ring of the last τ_max + 1 parameter copies, checkpointed so a killed
run resumes bitwise; BN running statistics are buffers, accumulated from the stale passes and never
rolled back. ``staleness=0`` runs nothing here. docs/communication.md has the keys and their cost."""

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

    @torch.no_grad()
    def begin(self, step: int) -> None:
        """Step ``step`` starts: the model's weights are W_step; they enter the ring."""
        slot = step % (self.tau_max + 1)
        torch._foreach_copy_(self.slots[slot], self.params)
        self.held[slot] = step
        self.step = self.loaded = step

    def use(self, worker: int) -> int:
        """Load W_{t−τ} for ``worker``'s forward/backward (W_0 while t < τ); returns τ, the
        staleness of ``worker``'s gradient at the current step."""
        fixed = self.dist == "fixed"
        tau = self.tau_max if fixed else draw(self.seed, self.step, worker, self.tau_max)
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
