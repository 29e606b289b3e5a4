"""Users over time for the load shapes of deploy/locust/shapes.py: steps (levels held in turn),
ramp (1 -> peak) and spike (base, a burst of peak users, base again). Pure functions of the run
time, so they are tested without Locust; None means the run is over."""

from __future__ import annotations

import math
from collections.abc import Sequence

from specpipe.core.errors import InvalidArgument

STEP_LEVELS = (1, 2, 4, 8, 16)
SHAPES = ("steps", "ramp", "spike")


def steps_users(t_s: float, levels: Sequence[int], hold_s: float) -> int | None:
    """levels[i] users for t in [i * hold_s, (i + 1) * hold_s)."""
    step = math.floor(t_s / hold_s)
    return levels[step] if 0 <= step < len(levels) else None


def ramp_users(t_s: float, peak: int, duration_s: float) -> int | None:
    """1 user at t = 0 rising linearly to `peak` at duration_s, then over."""
    if not 0 <= t_s < duration_s:
        return None
    return 1 + math.floor((peak - 1) * t_s / duration_s)


def spike_users(t_s: float, base: int, peak: int, duration_s: float) -> int | None:
    """`base` users, `peak` during the middle third of duration_s, base again, then over."""
    if not 0 <= t_s < duration_s:
        return None
    return peak if duration_s / 3 <= t_s < 2 * duration_s / 3 else base


def parse_levels(text: str) -> tuple[int, ...]:
    """`1,2,4,8,16` -> (1, 2, 4, 8, 16): positive user counts."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InvalidArgument(f"levels must be comma-separated user counts, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise InvalidArgument(f"levels must be user counts of at least 1, got {text!r}")
    return levels


def shape_users(shape: str, t_s: float, levels: Sequence[int], hold_s: float) -> int | None:
    """Users the shape wants at t_s. steps: each level held hold_s; ramp: 1 -> max(levels) over
    len(levels) * hold_s; spike: min(levels), max(levels) in the middle third of the same span."""
    duration_s = len(levels) * hold_s
    if shape == "steps":
        return steps_users(t_s, levels, hold_s)
    if shape == "ramp":
        return ramp_users(t_s, max(levels), duration_s)
    if shape == "spike":
        return spike_users(t_s, min(levels), max(levels), duration_s)
    raise InvalidArgument(f"unknown load shape {shape!r}; choose from {', '.join(SHAPES)}")
