"""The names of Cython's `cython` module that the compiled core's sources read at run time, for
when Cython is not installed (it is a build requirement, not a runtime one): the core's modules
then run from source (core/native.py) and import this stand-in in its place.

Compiled, a source's `import cython` is Cython's own module and none of this runs: `compiled` is
then a constant that prunes the from-source branches, and the decorators set compiler
directives. From source, the decorators leave what they decorate unchanged and the type names
are never evaluated where they annotate (annotations stay strings); `cython.locals(...)` reads
them as arguments, so they exist here, as None.
"""

from __future__ import annotations


def _directive(flag):
    """A compiler directive as a decorator (of a function or a class): nothing, from source."""
    return lambda decorated: decorated


class cython:  # noqa: N801 - named as the module it stands in for
    compiled = False
    longlong = None
    boundscheck = wraparound = overflowcheck = initializedcheck = staticmethod(_directive)

    @staticmethod
    def locals(**_types):
        return lambda function: function
