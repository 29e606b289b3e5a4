"""What every long-running process has: Prometheus metrics, structured logs, the session lifecycle
(cancellation, idle sweeping) and circuit breakers.

Imports specpipe.core and specpipe.config only."""
