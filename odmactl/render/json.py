"""Canonical JSON for machines: the same document gives the same bytes."""

from __future__ import annotations

import json
import math


def json_safe(value: object) -> object:
    """Replace non-finite floats (not valid JSON) with None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def to_json(data: object) -> str:
    """Deterministic JSON: sorted keys, fixed separators, non-finite floats as null."""
    return json.dumps(json_safe(data), sort_keys=True, indent=2, ensure_ascii=False)
