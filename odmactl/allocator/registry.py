"""The policy registry: name -> allocator class, and the settings classes their configs compose.

A policy is added by its own module and one `register(ThePolicy)` call: the CLI's choices, the
[allocator] table's keys (allocator/config.AllocatorConfig) and every command read this registry,
so nothing else changes. odmactl/allocator/__init__.py registers the shipped policies; a module of
one's own registers its policy when imported (tests/test_toy_policy.py does so from a temporary
module).
"""

from __future__ import annotations

from dataclasses import fields

from odmactl.core.errors import ConfigError

ALLOCATORS: dict[str, type] = {}
_SETTINGS: list[type] = []  # the registered policies' settings classes, each once, in registration order
SHARED: list[type] = []  # the settings every policy reads (config.SharedSettings), set by config.py
_generation = [0]  # counts changes, so that config.py may cache what it derives from the registry


def _names(settings: type) -> set[str]:
    return {f.name for f in fields(settings)}


def register(policy: type) -> type:
    """Add `policy` (its `name`, and the settings classes it reads, `settings`) to the registry;
    returns it, so it can decorate the class. A name taken by another class, or a setting's name
    that another settings class already owns, is refused: [allocator] keys are one namespace."""
    name = policy.name
    if not isinstance(name, str) or not name or name != name.strip():
        raise ConfigError(f"a policy needs a name, got {name!r}")
    if ALLOCATORS.get(name, policy) is not policy:
        raise ConfigError(f"policy '{name}' is registered already ({ALLOCATORS[name].__name__})")
    for settings in policy.settings:
        if settings in _SETTINGS:
            continue
        taken = {n: s for s in SHARED + _SETTINGS for n in _names(s)}
        clash = sorted(_names(settings) & set(taken))
        if clash:
            raise ConfigError(f"{settings.__name__} of policy '{name}' declares {', '.join(clash)}, which "
                              f"{taken[clash[0]].__name__} owns: a setting belongs to one settings class")
        _SETTINGS.append(settings)
    ALLOCATORS[name] = policy
    _generation[0] += 1
    return policy


def unregister(name: str) -> None:
    """Remove a policy, and the settings classes no other registered policy reads."""
    policy = ALLOCATORS.pop(name)
    still = {s for p in ALLOCATORS.values() for s in p.settings}
    for settings in policy.settings:
        if settings not in still and settings in _SETTINGS:
            _SETTINGS.remove(settings)
    _generation[0] += 1


def generation() -> int:
    """How many times the registry changed: what is derived from it is current while this is."""
    return _generation[0]


def settings_classes() -> tuple[type, ...]:
    """The shared settings, then every registered policy's, each once."""
    return tuple(SHARED + _SETTINGS)
