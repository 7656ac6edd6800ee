"""The policy registry: name -> allocator class, and the settings classes their configs compose.

A policy is added by its own module and one `register(ThePolicy)` call: the CLI's choices, the
[allocator] table's keys (allocator/config.AllocatorConfig) and every command read this registry,
so nothing else changes. odmactl/allocator/__init__.py registers the shipped policies; a module of
one's own registers its policy when imported (tests/test_toy_policy.py does so from a temporary
module).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass

from odmactl.core.errors import ConfigError, did_you_mean

ALLOCATORS: dict[str, type] = {}
_SETTINGS: list[type] = []  # the registered policies' settings classes, each once, in registration order
SHARED: list[type] = []  # the settings every policy reads (config.SharedSettings), set by config.py
_generation = [0]  # counts changes, so that config.py may cache what it derives from the registry


# AllocatorConfig's own members: no setting may take one of these names (config.py's class answers
# `config.NAME` for every other; tests/test_toy_policy.py checks the two lists agree)
RESERVED = frozenset({"replace", "values", "to_mapping", "from_mapping"})


def _names(settings: type) -> set[str]:
    return {f.name for f in fields(settings)}


def _checked(policy: type) -> tuple[str, tuple[type, ...]]:
    """`policy`'s name and settings classes, checked: a name, dataclasses whose fields are public
    names no other registered class (nor another of its own) owns."""
    name = getattr(policy, "name", None)
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ConfigError(f"a policy class needs a `name` (a non-empty string without outer spaces), got {name!r}")
    if ALLOCATORS.get(name, policy) is not policy:
        raise ConfigError(f"policy '{name}' is registered already ({ALLOCATORS[name].__name__})")
    settings = getattr(policy, "settings", None)
    if not isinstance(settings, tuple) or not all(isinstance(s, type) and is_dataclass(s) for s in settings):
        raise ConfigError(f"policy '{name}': `settings` must be a tuple of settings dataclasses "
                          f"(allocator/config.PolicySettings), got {settings!r}")
    taken = {n: s for s in SHARED + _SETTINGS for n in _names(s)}
    for cls in settings:
        if cls in _SETTINGS:
            continue
        bad = sorted(n for n in _names(cls) if n.startswith("_") or n in RESERVED)
        if bad:
            raise ConfigError(f"{cls.__name__} of policy '{name}' declares {', '.join(bad)}: a setting's name is "
                              f"public and not one of {', '.join(sorted(RESERVED))}")
        clash = sorted(_names(cls) & set(taken))
        if clash:
            raise ConfigError(f"{cls.__name__} of policy '{name}' declares {', '.join(clash)}, which "
                              f"{taken[clash[0]].__name__} owns: a setting belongs to one settings class")
        taken.update((n, cls) for n in _names(cls))
    return name, settings


def register(policy: type) -> type:
    """Add `policy` (its `name`, and the settings classes it reads, `settings`) to the registry;
    returns it, so it can decorate the class. Checked first, and nothing is added when a check
    fails: a name taken by another class, or a setting's name that another settings class owns, is
    refused ([allocator] keys are one namespace)."""
    name, settings = _checked(policy)
    _SETTINGS.extend(s for s in dict.fromkeys(settings) if s not in _SETTINGS)
    ALLOCATORS[name] = policy
    _generation[0] += 1
    return policy


def unregister(name: str) -> None:
    """Remove a policy, and the settings classes no other registered policy reads."""
    if not isinstance(name, str) or name not in ALLOCATORS:
        raise ConfigError(f"no policy {name!r} is registered (registered: {', '.join(ALLOCATORS)})")
    policy = ALLOCATORS.pop(name)
    still = {s for p in ALLOCATORS.values() for s in p.settings}
    for settings in policy.settings:
        if settings not in still and settings in _SETTINGS:
            _SETTINGS.remove(settings)
    _generation[0] += 1


def unknown_policy(name: object, what: str = "policy") -> str | None:
    """What is wrong with `name` as a policy's name (`what`: how the message calls one), naming the
    registered ones close to it and all of them; None when it is registered."""
    if isinstance(name, str) and name in ALLOCATORS:
        return None
    near = did_you_mean(name, ALLOCATORS) if isinstance(name, str) else None
    return f"unknown {what} {name!r}" + (f"; {near}" if near else "") + f" (choose from: {', '.join(ALLOCATORS)})"


def generation() -> int:
    """How many times the registry changed: what is derived from it is current while this is."""
    return _generation[0]


def settings_classes() -> tuple[type, ...]:
    """The shared settings, then every registered policy's, each once."""
    return tuple(SHARED + _SETTINGS)
