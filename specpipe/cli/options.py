"""Flags shared by several commands, built from the configs' settings (specpipe.core.settings): each
flag's name, default and help text come from its config field (specpipe.config.services,
specpipe.config.limits, specpipe.core.types), and a SPECPIPE_* variable (specpipe.config.env), where the
field names one, is its default."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from specpipe.cli.models_cmd import add_prepare_arg
from specpipe.config.env import variable_value
from specpipe.config.presets import PRESETS
from specpipe.config.services import AdmissionConfig, BatchConfig, ModelConfig, OrchestratorConfig, VerifierConfig
from specpipe.core import settings
from specpipe.core.settings import CHOICES, ENV, HELP, METAVAR, SHOWN
from specpipe.core.types import ALL_HYPOTHESES, DRAFTER_WITH_MODEL, SamplingParams, SpeculationOptions

DEFAULT = SpeculationOptions()  # the product's defaults, defined once (specpipe.core.types)
TYPES = {"int": int, "float": float}  # a setting's annotation -> its flag's type (else str)
Group = argparse.ArgumentParser | argparse._ArgumentGroup


def add_setting(parser: Group, cls: type, key: str, flag: str | None = None, prefix: str = "",
                **overrides: Any) -> None:
    """The flag of cls's setting key (--key with dashes, or flag), into dest prefix + key: its default
    (the SPECPIPE_* variable's value where one is set), choices, metavar and help from the field;
    overrides replace any of them (shown: the default as the help says it)."""
    f = settings.settings_of(cls)[key]
    meta = f.metadata
    default = settings.default_of(f)
    if meta[ENV] is not None and variable_value(meta[ENV]) is not None:
        default = variable_value(meta[ENV])
    kwargs: dict[str, Any] = {"default": default}
    if f.type == "bool" and not meta[CHOICES]:
        kwargs["action"] = "store_true"
    else:
        if f.type == "bool":
            kwargs["default"] = "on" if default else "off"
        else:
            kwargs["type"] = TYPES.get(str(f.type).removesuffix(" | None"), str)
        kwargs.update(metavar=meta[METAVAR], choices=meta[CHOICES])
    shown = overrides.pop("shown", meta[SHOWN])
    text = overrides.pop("help", meta[HELP])
    kwargs.update(overrides)
    if shown is None and kwargs.get("action") in ("store_true", "store_false"):
        shown = ""  # a switch's default goes without saying
    kwargs["help"] = help_text(text, shown, meta[ENV])
    parser.add_argument(flag or "--" + key.replace("_", "-"), dest=prefix + key, **kwargs)


def help_text(text: str, shown: str | None, env: str | None) -> str:
    """The help, then (default: ...; env ...): shown, else the flag's default; shown "" says none."""
    notes = [] if shown == "" else [f"default: {'%(default)s' if shown is None else shown.replace('%', '%%')}"]
    if env:
        notes.append(f"env {env}")
    return " ".join(part for part in (text.replace("%", "%%"), f"({'; '.join(notes)})" if notes else "") if part)


def add_settings(parser: Group, cls: type, *keys: str) -> None:
    for key in keys:
        add_setting(parser, cls, key)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    add_settings(group, ModelConfig, "preset", "verifier", "draft_model", "device")
    add_dtype_arg(group)
    add_setting(group, ModelConfig, "threads")
    add_compile_arg(group)
    add_prepare_arg(group)


def add_dtype_arg(parser: Group) -> None:
    add_setting(parser, ModelConfig, "dtype")


def add_compile_arg(parser: Group) -> None:
    add_settings(parser, ModelConfig, "compile", "draft_weights", "verifier_weights", "batching")


def add_speculation_args(parser: argparse.ArgumentParser, drafter: str | None = None, in_process: bool = False) -> None:
    """drafter: the --drafter default; None: resolved by specpipe.config.services.speculation, from
    --drafter-addr, or in_process (the command drafts in its own process) from the models. A flag left
    out is None: the builder's default (--draft-len alone turns adaptive control off)."""
    group = parser.add_argument_group("speculation")
    own = [name for name, p in PRESETS.items() if p.drafter_layers is None]
    default = drafter or (
        f"{DRAFTER_WITH_MODEL} where the preset's drafter is a separate small model ({', '.join(own)}, "
        f"or --draft-model), else {DEFAULT.drafter}"
        if in_process
        else f"{DRAFTER_WITH_MODEL} with --drafter-addr, else {DEFAULT.drafter}"
    )
    add_setting(group, SpeculationOptions, "drafter", default=drafter, shown=default)
    add_setting(group, OrchestratorConfig, "cache")
    add_setting(group, SpeculationOptions, "draft_len", default=None)
    add_settings(group, SpeculationOptions, "width", "schedule", "predictor")
    add_setting(group, SpeculationOptions, "hypotheses", type=hypotheses_arg)
    add_setting(group, SpeculationOptions, "adaptive", default=None)


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "sampling (temperature 0 = greedy, identical to the verifier's own greedy output)"
    )
    add_settings(group, SamplingParams, "temperature", "top_p", "top_k", "seed")


def hypotheses_arg(value: str) -> int:
    if value == "all":
        return ALL_HYPOTHESES
    try:
        m = int(value)
    except ValueError:
        m = 0
    if m < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or 'all', got {value!r}")
    return m


def speculation_flags(spec: SpeculationOptions) -> tuple[str, ...]:
    """The flags of spec, to pass on to another specpipe command."""
    def value(name: str) -> str:
        number = getattr(spec, name)
        return "all" if name == "hypotheses" and number == ALL_HYPOTHESES else str(number)

    return tuple(part for f in fields(SpeculationOptions) for part in ("--" + f.name.replace("_", "-"), value(f.name)))


def add_hop_delay_arg(parser: Group) -> None:
    add_setting(parser, OrchestratorConfig, "hop_delay_ms")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)


HEALTH_THREADS = 4  # server threads kept free of admitted work: health and reflection never wait


def add_admission_args(parser: argparse.ArgumentParser, role: str) -> None:
    """--max-sessions / --max-queue (verifier and orchestrator); the verifier's batching flags."""
    group = parser.add_argument_group("admission" if role == "orchestrator" else "admission and batching")
    if role == "orchestrator":
        add_settings(group, AdmissionConfig, "max_sessions", "max_queue")
        return
    add_setting(group, VerifierConfig, "max_sessions")
    add_settings(group, BatchConfig, "max_queue", "max_batch_tokens", "prefill_chunk", "prefill_stall", "gather_grace")


def worker_threads(args: argparse.Namespace) -> int:
    """gRPC server threads: every admitted or queued request holds one, plus HEALTH_THREADS to spare."""
    admitted = getattr(args, "max_queue", 0) + (args.max_sessions if args.role == "orchestrator" else 0)
    return max(args.max_workers, admitted + HEALTH_THREADS)
