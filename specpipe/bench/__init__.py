"""Measurement: the single-stream bench against its baselines, its reports and plots, the prompt sets
and the recurring workload, the verify-cost curve and its bounds, and the load test's statistics,
shapes and reports.

Builds what it measures through specpipe.app; nothing below imports it."""
