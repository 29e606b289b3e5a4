"""Settings: a config field that carries its help text beside its default, so that each default and
what it means are written once (SGLang's ServerArgs, vLLM's EngineArgs). The CLI builds its flags from
them (specpipe.cli.options.add_settings), the config builders read a mapping of settings by their keys
(specpipe.config.services), and tests check the deploy files (deploy/ray, deploy/k8s) against them.

A setting's key is its name in a mapping of settings and, with dashes, its command-line flag: the field's
name unless the setting names another (session_ttl for the field session_ttl_s, as the flag says
--session-ttl without its unit). Pure: dataclass metadata only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, field, fields
from typing import Any

HELP, KEY, ENV, METAVAR, CHOICES, SHOWN = "help", "key", "env", "metavar", "choices", "shown"


def setting(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
            key: str | None = None, env: str | None = None, metavar: str | None = None,
            choices: tuple[Any, ...] | None = None, shown: str | None = None) -> Any:
    """A dataclass field with its help text. key: its mapping key and flag where they differ from the
    field's name; env: the SPECPIPE_* variable whose value is the flag's default (specpipe.config.env);
    shown: the default as --help says it where the value alone does not (off, all cores)."""
    metadata = {HELP: help, KEY: key, ENV: env, METAVAR: metavar, CHOICES: choices, SHOWN: shown}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def setting_key(f: Field[Any]) -> str:
    """The field's key in a mapping of settings (its flag's name with underscores)."""
    return f.metadata.get(KEY) or f.name


def is_setting(f: Field[Any]) -> bool:
    return HELP in f.metadata


def settings_of(cls: type) -> dict[str, Field[Any]]:
    """key -> field, for every setting of the dataclass cls."""
    return {setting_key(f): f for f in fields(cls) if is_setting(f)}


def default_of(f: Field[Any]) -> Any:
    """The field's default (a factory's value where it has one)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise ValueError(f"{f.name} has no default")


def given(values: Mapping[str, Any], cls: type, prefix: str = "") -> dict[str, Any]:
    """The fields of cls that values sets (by prefix + each field's key), None left out: the keyword
    arguments of cls's constructor for its settings, every other field taking its default."""
    return {f.name: values[prefix + setting_key(f)] for f in fields(cls)
            if is_setting(f) and values.get(prefix + setting_key(f)) is not None}
