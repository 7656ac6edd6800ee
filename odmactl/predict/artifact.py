"""The predictor artifact: a directory holding `weights.safetensors` and `predictor.toml`.

predictor.toml names the format and its version, the odmactl / torch / transformers versions that
wrote it, the settings and fitted state (vocabularies, normalisation, class edges, encoder), the
training data's digest, the weights file's SHA-256, and whatever the caller adds (buckets, the
held-out evaluation); its first key, `manifest_sha256`, is the SHA-256 of the rest of it as
written. Reading checks all of it before building anything, so a truncated, corrupted, edited or
version-mismatched artifact is a PredictorError naming the file and what is wrong:
- the manifest's content must match `manifest_sha256` (an edited value would change predictions);
- the format version must be this odmactl's, and the odmactl version that wrote it must share this
  one's major and minor version (a patch release reads it; another minor release refits);
- every number must be finite, and the weights must match `weights_sha256`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from pathlib import Path

import tomli_w

from odmactl import __version__
from odmactl.core.stops import import_whole
from odmactl.core.digest import file_sha256
from odmactl.core.errors import PredictorError, did_you_mean
from odmactl.core.tomltable import TomlTable, load_toml
from odmactl.predict.network import build_net
from odmactl.predict.predictor import LengthPredictor
from odmactl.predict.settings import PREDICTOR_CHOICES, FittedState, PredictorSettings

FORMAT = "odmactl-predictor"
FORMAT_VERSION = 3  # 2: the quantile head and the headroom uncertainty; 3: manifest_sha256
WEIGHTS = "weights.safetensors"
MANIFEST = "predictor.toml"



def not_an_artifact(directory: Path) -> str | None:
    """None when `directory` is an artifact odmactl wrote (its predictor.toml names this format),
    else why not: what `fit --force` may replace."""
    manifest = Path(directory) / MANIFEST
    if not manifest.is_file():
        return f"holds no {MANIFEST}"
    try:
        head = manifest.read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return f"its {MANIFEST} cannot be read"
    if f'format = "{FORMAT}"' not in head:
        return f"its {MANIFEST} is not an odmactl predictor's (no format = \"{FORMAT}\")"
    return None

def _drop_none(value):
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def write_artifact(predictor: LengthPredictor, directory: Path, extra: dict) -> None:
    """Write both files into `directory` (created if needed; the CLI makes it atomic)."""
    torch = import_whole("torch")  # never interrupted half-way (core/stops.py)
    import transformers
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in predictor.net.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": f"{FORMAT}/{FORMAT_VERSION}"})  # one key: the header keeps a stable order
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory / WEIGHTS, 0o666 & ~umask)  # safetensors creates it 0600; like every other output
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "versions": {"odmactl": __version__, "torch": torch.__version__.split("+")[0],
                     "transformers": transformers.__version__},
        "weights_file": WEIGHTS, "weights_sha256": file_sha256(directory / WEIGHTS),
        "settings": dataclasses.asdict(predictor.settings),
        "state": dataclasses.asdict(predictor.state),
        **extra,
    }
    body = _drop_none(manifest)
    text = tomli_w.dumps({"manifest_sha256": _manifest_digest(body), **body})
    (directory / MANIFEST).write_text(text, encoding="utf-8")


def _manifest_digest(body: dict) -> str:
    """SHA-256 of the manifest's content (all but `manifest_sha256`) as TOML: what it was written as."""
    return hashlib.sha256(tomli_w.dumps(body).encode("utf-8")).hexdigest()


def _release(version: str) -> tuple[str, ...]:
    return tuple(str(version).split(".")[:2])


def _non_finite(value, key: str = "") -> str | None:
    """The dotted key of the first NaN or infinity in a parsed TOML document, else None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else key
    if isinstance(value, dict):
        children = ((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        children = ((f"{key}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for child_key, child in children:
        found = _non_finite(child, child_key)
        if found is not None:
            return found
    return None


def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not directory.is_dir():  # a bare name close to oracle or none was likely meant as one
        near = did_you_mean(str(directory), PREDICTOR_CHOICES) if len(directory.parts) == 1 else None
        raise PredictorError("no such predictor directory" + (f"; {near}" if near else ""), file=directory,
                             hint=f"make one with `odmactl fit`, or give {' or '.join(PREDICTOR_CHOICES)}")
    if not path.is_file():
        raise PredictorError(f"not a predictor artifact: {MANIFEST} is missing", file=directory,
                             hint="make one with `odmactl fit`")
    manifest = load_toml(path, PredictorError)
    if manifest.get("format") != FORMAT:
        raise PredictorError(f"not an odmactl predictor manifest (format = {manifest.get('format')!r})", file=path,
                             key="format")
    version = manifest.get("format_version")
    versions = manifest.get("versions")
    wrote = versions.get("odmactl", "an unknown version") if isinstance(versions, dict) else "an unknown version"
    if version != FORMAT_VERSION:
        raise PredictorError(f"artifact format version {version!r} (written by odmactl {wrote}); this odmactl "
                             f"{__version__} reads version {FORMAT_VERSION}", file=path, key="format_version",
                             hint="refit with `odmactl fit`")
    claimed = manifest.pop("manifest_sha256", None)
    if claimed != _manifest_digest(manifest):
        raise PredictorError("the manifest's content does not match its manifest_sha256: it was edited or damaged "
                             "after `odmactl fit` wrote it", file=path, key="manifest_sha256",
                             hint="refit with `odmactl fit`")
    if _release(wrote) != _release(__version__):
        raise PredictorError(f"written by odmactl {wrote}; this odmactl {__version__} reads artifacts of odmactl "
                             f"{'.'.join(_release(__version__))}.x", file=path, key="versions.odmactl",
                             hint="refit with `odmactl fit`")
    bad = _non_finite(manifest)
    if bad is not None:
        raise PredictorError("expected a finite number, found NaN or infinity", file=path, key=bad)
    return manifest


def _section(manifest: dict, name: str, cls, path: Path):
    """Rebuild dataclass `cls` from table `name`: every key is required (a silent default could
    change predictions) except optional ones (None), and every value must have its field's type."""
    if name not in manifest:
        raise PredictorError(f"missing table [{name}]", file=path, key=name)
    return TomlTable(manifest[name], path, name, PredictorError).to_dataclass(cls, all_required=True)


def read_artifact(directory: Path, *, encoder_dir: Path | None = None) -> LengthPredictor:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    manifest = read_manifest(directory)
    path = directory / MANIFEST
    settings = _section(manifest, "settings", PredictorSettings, path)
    state = _section(manifest, "state", FittedState, path)
    name = manifest.get("weights_file", WEIGHTS)
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise PredictorError(f"expected a file name inside the artifact folder, got {name!r}", file=directory / MANIFEST,
                             key="weights_file")
    weights = directory / name
    if not weights.is_file():
        raise PredictorError("the weights file is missing", file=weights)
    if file_sha256(weights) != manifest.get("weights_sha256"):
        raise PredictorError(f"does not match weights_sha256 in {MANIFEST}: the file is corrupted, truncated "
                             "or from another fit", file=weights)
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise PredictorError(f"unreadable safetensors file ({exc})", file=weights) from exc
    encoder = None
    if settings.family == "encoder":
        from odmactl.predict.encoder import TextEncoder, encoder_fingerprint

        where = Path(encoder_dir or state.encoder_dir or "")
        if not (where / "config.json").is_file():
            raise PredictorError(f"the encoder this predictor was fitted with is not at '{where}'", file=path,
                                 key="state.encoder_dir", hint="pass its directory with --encoder")
        if encoder_fingerprint(where) != state.encoder_sha256:
            raise PredictorError(f"the encoder at '{where}' is not the one this predictor was fitted with "
                                 "(config or weights differ)", file=path, key="state.encoder_sha256")
        encoder = TextEncoder(where, max_length_tokens=settings.encoder_max_length_tokens)
    net = build_net(settings, state, encoder)
    try:
        net.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise PredictorError(f"weights do not fit the network the manifest describes ({first})", file=weights) from exc
    return LengthPredictor(settings, state, net, encoder)
