"""The composition root: the one place that wires services together."""
