"""The host link's time in a replay: the bytes a policy's collaborators (a host tier, an adapter
cache) move between host memory and the devices, charged at the device profile's link and
overlapped with the compute they serve."""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.hw.cost import to_ps


class HostLink:
    """Transfers over the host link, overlapped layer by layer with the compute they serve (eLLM
    §4.3.2, ADR-006's warm tier): an iteration takes the longer of its compute and its transfer,
    and what the transfer adds is `bottleneck_ps`. `sources` are the collaborators whose
    `host_bytes` count the bytes moved (each object once); `pending_ps` a fetch's transfer,
    overlapped with the next decode iteration. Invariant: `moved_bytes` is the sources' bytes
    moved since the replay began, and `link_ps` their time at the link's bandwidth."""

    __slots__ = ("cost", "sources", "seen", "moved_bytes", "link_ps", "bottleneck_ps", "pending_ps")

    def __init__(self, cost, sources: list) -> None:
        self.cost = cost
        self.sources = []
        for s in sources:
            if s is not None and not any(s is t for t in self.sources):
                self.sources.append(s)
        self.seen = self._total()
        self.moved_bytes = 0
        self.link_ps = self.bottleneck_ps = self.pending_ps = 0

    def _total(self):
        return sum(s.host_bytes for s in self.sources)

    def moved_ps(self) -> cython.longlong:
        """The link time of the bytes moved since the last call (0 without)."""
        if not self.sources:
            return 0
        moved = self._total() - self.seen
        if moved == 0:
            return 0
        self.seen += moved
        self.moved_bytes += moved
        dt: cython.longlong = to_ps(self.cost.host_link_s(moved))
        self.link_ps += dt
        return dt

    def with_moves(self, compute_ps: cython.longlong) -> cython.longlong:
        """An iteration of `compute_ps` of compute with the bytes moved for it since the last call
        (adapters loaded, KV offloaded) overlapped: the longer of the two."""
        return compute_ps + self.beyond(self.moved_ps(), compute_ps)

    def beyond(self, link_ps: cython.longlong, compute_ps: cython.longlong) -> cython.longlong:
        """What a transfer of `link_ps` overlapped with `compute_ps` of compute adds (0 when hidden)."""
        if link_ps <= compute_ps:
            return 0
        self.bottleneck_ps += link_ps - compute_ps
        return link_ps - compute_ps

    def overlap_pending(self, first_ps: cython.longlong) -> cython.longlong:
        """The pending fetch's transfer beside the first decode iteration after it (`first_ps`
        long): what it adds."""
        link: cython.longlong = self.pending_ps
        self.pending_ps = 0
        return self.beyond(link, first_ps)
