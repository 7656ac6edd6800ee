"""AllocatorConfig: a replay's allocator settings, composed of each policy's own settings class.

Every policy module declares its settings as a frozen dataclass (a `PolicySettings`), and lists
the settings classes it reads in its `settings` attribute; the registry (allocator/registry.py)
collects them. The [allocator] table of a config file is one flat namespace of their fields (a
name belongs to exactly one class), so `AllocatorConfig` reads a flat mapping, hands each class its
keys, and answers `config.NAME` from the class that owns NAME. A seventh policy adds its settings
class in its own module, and its keys are accepted, checked and written like the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from odmactl.allocator.registry import SHARED, generation, settings_classes
from odmactl.core.errors import ConfigError, OdmaError
from odmactl.core.limits import MAX_TOKENS, whole_number_problem
from odmactl.core.tomltable import TomlTable, unknown_key


def whole_numbers(settings, *checks: tuple[str, int, int]) -> None:
    """Raise ConfigError naming the first field of `settings` among (name, low, high) that is not a
    whole number in [low, high] (None passes where the field's default is None: unset)."""
    defaults = {f.name: f.default for f in dataclasses.fields(settings)}
    for name, low, high in checks:
        value = getattr(settings, name)
        problem = None if value is None and defaults[name] is None else whole_number_problem(value, low, high)
        if problem is not None:
            raise ConfigError(problem, key=name)


def one_of(settings, name: str, choices: tuple[str, ...]) -> None:
    """Raise ConfigError unless field `name` of `settings` is one of `choices`."""
    value = getattr(settings, name)
    if value not in choices:
        raise ConfigError(f"expected one of {', '.join(choices)}, got {value!r}", key=name)


def number_problem(value, low: float, high: float) -> bool:
    """True unless `value` is a real number (not a bool) in [low, high]."""
    return isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high


@dataclass(frozen=True)
class PolicySettings:
    """The [allocator] keys one policy module owns, as a frozen dataclass; its own `__post_init__`
    checks each value where it enters. `SEQUENCES` names the fields that are lists in TOML (tuples
    here); `check(max_model_len_tokens)` checks what depends on the shared max_model_len;
    `to_mapping()` is the table a config writes (None values left out)."""

    SEQUENCES: ClassVar[tuple[str, ...]] = ()

    def check(self, max_model_len_tokens: int) -> None:
        """Checks against max_model_len (none unless a class says so)."""

    def settable(self) -> dict[str, object]:
        """The fields by name, in the form they are set in (a named value by its name)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_mapping(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        for name in self.SEQUENCES:
            out[name] = list(out[name])
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class SharedSettings(PolicySettings):
    """What every policy reads: `max_model_len_tokens`, the most KV tokens (prompt + generated) one
    request may hold."""

    max_model_len_tokens: int = 4096

    def __post_init__(self) -> None:
        whole_numbers(self, ("max_model_len_tokens", 1, MAX_TOKENS))


SHARED[:] = [SharedSettings]


_FIELDS: list = [-1, {}, {}]  # [the registry generation they were derived at, owners, defaults]


def _derived() -> list:
    if _FIELDS[0] != generation():
        fields = [(f, cls) for cls in settings_classes() for f in dataclasses.fields(cls)]
        _FIELDS[:] = [generation(), {f.name: cls for f, cls in fields}, {f.name: f.default for f, _ in fields}]
    return _FIELDS


def _owners() -> dict[str, type]:
    """Each setting's name -> the settings class that owns it."""
    return _derived()[1]


def _defaults() -> dict[str, object]:
    """Each setting's default."""
    return _derived()[2]


def _rebuild(values: dict) -> AllocatorConfig:
    return AllocatorConfig(**values)


class AllocatorConfig:
    """The settings of every registered policy, composed (the module docstring): `config.NAME`
    reads a setting from the class that owns it, `replace(**changes)` gives a new config (checked
    again), `to_mapping()` the flat table. A policy reads the fields it needs and ignores the rest.

    Invariants: immutable; `_parts` holds one instance of every settings class registered when it
    was built, each checked by its own `__post_init__` and against max_model_len (`check`)."""

    __slots__ = ("_parts",)

    def __init__(self, **settings) -> None:
        """The settings by name, checked as a config file's are (types, ranges, unknown keys); a
        None where the setting's default is None is that default."""
        defaults = _defaults()
        self._compose(*_parts({k: v for k, v in settings.items() if not (v is None and defaults.get(k, 0) is None)},
                              None, ""))

    def _compose(self, table: TomlTable, parts: dict) -> None:
        max_len = parts[SharedSettings].max_model_len_tokens
        try:
            for part in parts.values():
                part.check(max_len)
        except OdmaError as exc:  # a check against max_model_len: name the file and the key
            raise (table.error(exc.key, exc.message) if exc.key else exc) from None
        object.__setattr__(self, "_parts", parts)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        owner = _owners().get(name)
        parts = object.__getattribute__(self, "_parts")
        if owner is None or owner not in parts:
            raise AttributeError(f"no allocator setting '{name}'")
        return getattr(parts[owner], name)

    def __setattr__(self, name: str, value) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field '{name}'")

    def values(self) -> dict[str, object]:
        """Every setting's value by name, as one would set it (`PolicySettings.settable`)."""
        out: dict[str, object] = {}
        for part in self._parts.values():
            out.update(part.settable())
        return out

    def replace(self, **changes) -> AllocatorConfig:
        """A copy with `changes` applied, checked again (dataclasses.replace for the composition)."""
        return AllocatorConfig(**{**self.values(), **changes})

    def to_mapping(self) -> dict[str, object]:
        """The flat [allocator] table of these settings (None values left out)."""
        out: dict[str, object] = {}
        for part in self._parts.values():
            out.update(part.to_mapping())
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AllocatorConfig) and self._parts == other._parts

    def __hash__(self) -> int:
        return hash(tuple(self._parts.values()))

    def __repr__(self) -> str:
        return "AllocatorConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.values().items()) + ")"

    def __reduce__(self):
        return _rebuild, (self.values(),)

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], source: str | Path | None = None,
                     prefix: str = "") -> AllocatorConfig:
        """Build from a TOML table (`prefix` its name in the file, e.g. "allocator"); an unknown key or
        a bad value names the file and the key."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"expected a table of settings, got {type(data).__name__}", file=source,
                              key=prefix or None)
        config = cls.__new__(cls)
        config._compose(*_parts(data, source, prefix))
        return config


def _parts(data: Mapping[str, object], source: str | Path | None, prefix: str) -> tuple[TomlTable, dict]:
    """The table and one checked instance of every registered settings class, from its keys in
    `data` (TomlTable.to_dataclass: types, finite numbers, lists as tuples, the class's own checks);
    an unknown key names the known ones."""
    table = TomlTable(dict(data), source, prefix)
    owners = _owners()
    for name in table.data:
        if name not in owners:
            raise table.error(name, unknown_key(name, owners))
    parts = {}
    for settings in settings_classes():
        mine = {k: v for k, v in table.data.items() if owners[k] is settings}
        sequence = {name: _as_tuple for name in settings.SEQUENCES}
        parts[settings] = TomlTable(mine, source, prefix).to_dataclass(settings, convert=sequence)
    return table, parts


def _as_tuple(value):
    """A TOML list as a tuple; anything else as it is, for the settings' checks to name."""
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class Deployment:
    """What a policy may need to know of the deployment it is replayed on, besides the pool, for
    `complete_config` to fill in its settings and for its limits during a replay (the run layer
    measures these from the profiles): `activation_peak_bytes`, the activation memory a static
    engine reserves at its batch limits (modelled, hw/cost.CostModel.activation_bytes, and at most
    the profile's activation reserve), `activation_reserve_bytes`, the memory the profile keeps
    aside for activations (what exists to borrow), the activation demand of an iteration per token
    and per sequence producing logits (`activation_bytes_per_token`, `_per_sequence`: the cost
    model's, so that one iteration of T tokens and S sequences needs T x the first + S x the
    second), and `lora_bytes_per_rank`, the bytes of a rank-1 LoRA adapter on the attention
    projections, all over the tensor-parallel group; `max_new_tokens`, the run's output cap (vLLM's
    max_tokens: no request generates more). Zero: unknown (for the cap: none)."""

    activation_peak_bytes: int = 0
    activation_reserve_bytes: int = 0  # the profile's activation reserve over the group: the most to borrow
    activation_bytes_per_token: int = 0
    activation_bytes_per_sequence: int = 0
    lora_bytes_per_rank: int = 0
    adapters: bool = False  # the workload names tenants, each with its LoRA adapter
    max_new_tokens: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "adapters":
                if not isinstance(value, bool):
                    raise ConfigError(f"expected true or false, got {value!r}", key=f.name)
            elif whole_number_problem(value, 0, 1 << 62) is not None:
                raise ConfigError(f"expected a byte count >= 0, got {value!r}", key=f.name)

    def activation_bytes(self, tokens: int, sequences: int) -> int:
        """One iteration's activation demand (hw/cost.CostModel.activation_bytes)."""
        return tokens * self.activation_bytes_per_token + sequences * self.activation_bytes_per_sequence
