"""Model presets: which verifier and drafter a name stands for (no torch here, so --help is fast).

Model loading lives in specpipe.engine.models; the packaged real models in specpipe.models.packaged.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpipe.core.errors import InvalidArgument


@dataclass(frozen=True)
class Preset:
    name: str
    verifier: str                  # packaged model name (specpipe.models.packaged) or "tiny"
    drafter: str
    drafter_layers: int | None     # truncate the drafter to its first layers (self-speculation)


PRESETS = {
    "tiny": Preset("tiny", "tiny", "tiny", drafter_layers=2),
    "smollm2": Preset("smollm2", "smollm2-135m", "smollm2-135m", drafter_layers=16),
    "qwen-coder": Preset("qwen-coder", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", drafter_layers=None),
}
DEFAULT_PRESET = "qwen-coder"


@dataclass(frozen=True)
class ModelSpec:
    """What one role loads: a packaged name or a path / model id, optionally layer-truncated."""

    source: str
    num_layers: int | None = None

    @property
    def label(self) -> str:
        return self.source if self.num_layers is None else f"{self.source}[:{self.num_layers} layers]"


def model_specs(
    preset: str, verifier: str | None = None, draft_model: str | None = None
) -> tuple[ModelSpec, ModelSpec]:
    """(verifier spec, drafter spec) for a preset, with explicit paths or ids taking precedence."""
    if preset not in PRESETS:
        raise InvalidArgument(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    p = PRESETS[preset]
    verifier_spec = ModelSpec(verifier) if verifier else ModelSpec(p.verifier)
    if draft_model:
        drafter_spec = ModelSpec(draft_model)
    elif verifier:  # self-speculation on the given verifier needs a drafter; use its first layers
        drafter_spec = ModelSpec(verifier, p.drafter_layers)
    else:
        drafter_spec = ModelSpec(p.drafter, p.drafter_layers)
    return verifier_spec, drafter_spec
