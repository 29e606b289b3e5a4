"""Load shapes for locustfile.py (`-f deploy/locust/locustfile.py,deploy/locust/shapes.py`):
--shape steps holds each of --levels users for --hold-s seconds; ramp goes from 1 user to the largest
level, spike holds the smallest and bursts to the largest in the middle third, both over
len(levels) * hold-s. The arithmetic is specpipe.bench.loadshapes."""

from __future__ import annotations

from locust import LoadTestShape, events

from specpipe.bench.loadshapes import SHAPES, parse_levels, shape_users


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:
    parser.add_argument("--shape", default="steps", choices=SHAPES, help="(default: %(default)s)")
    parser.add_argument("--levels", default="1,2,4,8,16", help="user counts (default: %(default)s)")
    parser.add_argument("--hold-s", type=float, default=30.0, help="seconds per level (default: %(default)s)")


class SpecpipeShape(LoadTestShape):
    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options
        levels = parse_levels(options.levels)
        users = shape_users(options.shape, self.get_run_time(), levels, options.hold_s)
        return None if users is None else (users, float(max(levels)))  # spawn a whole level at once
