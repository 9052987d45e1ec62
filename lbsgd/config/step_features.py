"""The step features (lbsgd.features) in one table, in the order a run calls them: for each, the
key that asks for it, its class, whether a run carries it, when the run makes it, and why the
asynchronous parameter server refuses it.

:mod:`lbsgd.features` makes and orders a run's features from this table (:data:`TABLE`) and
:mod:`lbsgd.config.checks` its refusals under ``async_ps=true`` (the parameter server has no
synchronous step, hence no step features). A new feature joins with one row here and its
:class:`~lbsgd.features.StepFeature` class (made from the run's ``features.Parts``);
tests/test_features.py holds the two together."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from lbsgd.config.derived import Derived
from lbsgd.config.schema import Keys


@dataclass(frozen=True)
class StepFeatureRow:
    name: str  # the feature's name (StepFeature.name)
    cls: str  # its StepFeature class in lbsgd.features (made from the run's features.Parts)
    example: Mapping[str, Any]  # keys that ask for it (tests/test_features.py trains with them)
    asked: Callable[[Keys], bool]  # its keys ask for it
    setting: Callable[[Keys], str]  # how they read in a refusal: "noise_scale=true"
    off: str  # the setting that asks for nothing: "noise_scale=false"
    no_async_ps: str  # why async_ps=true refuses it (a clause)
    # the run makes it before DDP wraps the network (its bucket reader is DDP's) or after (it
    # needs DDP's comm state or the optimizer's final state)
    stage: Literal["before_wrap", "after_wrap"] = "before_wrap"
    # whether a run with these derived values carries it (by default: whenever asked)
    carried: Callable[[Keys, Derived], bool] | None = None
    # the same mathematics on any layout (k processes = 1 process accumulating k micro-batches,
    # up to float reordering) as a synchronous run's; false where the processes are part of it
    layout_free: bool = True

    @property
    def key(self) -> str:
        """The key that asks for it (its example's first)."""
        return next(iter(self.example))

    def carried_by(self, c: Keys, d: Derived) -> bool:
        return self.carried(c, d) if self.carried else self.asked(c)

    def async_ps_refusal(self, c: Keys) -> str:
        return f"async_ps=true {self.no_async_ps}: not with {self.setting(c)} (valid: {self.off})"


def bmuf_filters(c: Keys) -> bool:
    """Whether BMUF's filter (lbsgd.comm.BMUF) changes the mathematics of periodic averaging
    (η_B ≠ 0 or ε_B ≠ 1)."""
    return c.block_momentum != 0 or c.block_lr != 1


# The order in which a run calls its features at every hook (and packs their flush values),
# declared here rather than left to the order of their making. Why this one:
# - noise_scale reads each micro-batch's gradient as the backward leaves it (after_backward) and
#   the accumulated one (after_accumulate) before any other feature acts on the step;
# - staleness puts the current weights back (after_accumulate) before the optimizer steps them;
# - grad_clip acts on the unscaled, all-reduced gradient (before_optimizer_step);
# - powersgd only keeps its state (checkpointed per rank);
# - local_sgd averages the parameters once the optimizer has stepped (after_optimizer_step), after
#   everything else has acted on the step.
TABLE: tuple[StepFeatureRow, ...] = (
    StepFeatureRow(
        "noise_scale",
        "NoiseProbe",
        example={"noise_scale": True},
        asked=lambda c: c.noise_scale,
        setting=lambda c: "noise_scale=true",
        off="noise_scale=false",
        no_async_ps="has no all-reduced gradient of every step, which the noise scale needs",
        carried=lambda c, d: d.noise_batch is not None,
    ),
    StepFeatureRow(
        "staleness",
        "Staleness",
        example={"staleness": 1},
        asked=lambda c: c.staleness > 0,
        setting=lambda c: f"the simulated staleness={c.staleness}",
        off="staleness=0",
        no_async_ps="measures real staleness",
    ),
    StepFeatureRow(
        "grad_clip",
        "GradClip",
        example={"grad_clip": 1.0},
        asked=lambda c: c.grad_clip is not None,
        setting=lambda c: f"grad_clip={c.grad_clip}",
        off="grad_clip=null",
        no_async_ps="applies each worker's gradient as it arrives, with no step to clip in",
    ),
    StepFeatureRow(
        "powersgd",
        "PowerSGDState",
        example={"comm_hook": "powersgd"},
        asked=lambda c: c.comm_hook == "powersgd",
        setting=lambda c: "comm_hook=powersgd",
        off="comm_hook=none",
        no_async_ps="sends each gradient to the server point to point, with no all-reduce to "
        "compress",
        stage="after_wrap",
        carried=lambda c, d: c.comm_hook == "powersgd" and d.world_size > 1,
        layout_free=False,  # each of K processes compresses its own gradient, with its own error
    ),
    StepFeatureRow(
        "local_sgd",
        "LocalSGD",
        example={"local_sgd": 2},
        asked=lambda c: c.local_sgd > 0,
        setting=lambda c: f"local_sgd={c.local_sgd}",
        off="local_sgd=0",
        no_async_ps="applies each worker's gradient on the server as it arrives",
        stage="after_wrap",
        # local SGD on more than one process; BMUF's filter on any number
        carried=lambda c, d: c.local_sgd > 0 and (d.world_size > 1 or bmuf_filters(c)),
        layout_free=False,  # K models averaged
    ),
)


def world_size_key(c: Keys) -> str | None:
    """The experiment key that makes the number of processes K part of the run's mathematics, or
    None. A synchronous run is the same on any layout (k processes x m = 1 process accumulating k
    micro-batches of m); a step feature that is not layout-free (:data:`TABLE`) makes K part of
    it: under ``local_sgd`` (and BMUF on its blocks) K models are averaged, under
    ``comm_hook=powersgd`` each of K processes compresses its own gradient with its own error;
    under ``async_ps`` the K - 1 workers set the staleness: a run of K processes is another
    experiment than one of K' (:func:`lbsgd.rundir.check_run_dir` and the sweep's identical-run
    search hold it)."""
    if c.async_ps:
        return "async_ps"
    return next((row.key for row in TABLE if not row.layout_free and row.asked(c)), None)
