"""matplotlib for the bench's and the load test's plots: an extra (`pip install 'specpipe[bench]'`), so
that no service installs a plotting library."""

from __future__ import annotations

from typing import Any

from specpipe.core.errors import FailedPrecondition


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display), or a one-line error naming the extra."""
    try:
        import matplotlib
    except ImportError:
        raise FailedPrecondition("plots need matplotlib: pip install 'specpipe[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
