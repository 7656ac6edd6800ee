__version__ = "0.1.0"

from odmactl.core import native as _native

_native.select()  # before any compiled-core module is imported: see odmactl/core/native.py
