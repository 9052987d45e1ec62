"""Numerics of the forward/backward pass: fp32, bf16, or fp16 with dynamic loss scaling.

One code path for all three (the trainer never branches on precision): ``autocast``, ``backward``,
``unscale`` and ``step``, each a no-op where the precision needs none. Parameters stay fp32, the
master weights of Jia et al. 2018 §3. Under fp16 the gradients are unscaled before the optimizer
runs, so LARS trust ratios and weight decay see the true gradients; a step with inf/NaN is skipped
and the scale halves (``torch.amp.GradScaler``, the only one in lbsgd)."""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class Precision:
    def __init__(self, precision: str, device: torch.device, loss_scale: float = 2.0**16) -> None:
        if precision not in DTYPES:
            raise ValueError(f"precision={precision!r} is not one of {', '.join(DTYPES)}")
        self.name = precision
        self.dtype = DTYPES[precision]
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(
            device.type, init_scale=loss_scale, enabled=precision == "fp16"
        )
        # skipped steps counted on the device: the step never waits for the GPU to say whether
        # it overflowed; the count is read at a metric flush (``skipped_steps``)
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)
        self._skipped_before = 0  # restored from a checkpoint

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 when no scaling is done). Reads the device."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else 1.0

    def loss_scale_tensor(self) -> torch.Tensor | float:
        """The current loss scale without a host read: a copy of the device tensor (fp16), 1.0
        otherwise. For logging at the next flush."""
        if not self.scaler.is_enabled() or self.scaler._scale is None:
            return self.loss_scale
        return self.scaler._scale.detach().clone()

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped because fp16 gradients overflowed. Reads the device."""
        return self._skipped_before + int(self._skipped.item())

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """fp16: ``optimizer``'s gradients divided by the loss scale in place (inf/NaN noted: the
        step is then skipped), once per step, before :meth:`step`; otherwise nothing."""
        if self.scaler.is_enabled():
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale, step unless the gradients overflowed, update the scale; no host read."""
        if not self.scaler.is_enabled():
            optimizer.step()
            return
        self.scaler.step(optimizer)  # unscales first unless unscale() did, skips on inf/NaN
        before = self.scaler._scale.detach().clone()
        self.scaler.update()
        self._skipped += self.scaler._scale < before  # the scale only drops after an overflow

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self._skipped_before = int(state.get("skipped_steps", 0))
        self._skipped.zero_()
