"""Configuration: what a service is told, as frozen validated dataclasses (model presets, input
limits, the model, batching and service configs), and the SPECPIPE_* environment, read in one place.

Imports specpipe.core only; the CLI, the Ray application and tests build these, the composition root
(specpipe.app) consumes them."""
