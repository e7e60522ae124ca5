"""The fragment index of one partition: what the store holds, from its listings.

Theory of operation (Gazette's fragment index): the store's listing is the truth about what
exists there. Each listing replaces what the index holds, so fragments a bucket lifecycle
rule or a prune removed leave it, and fragments another writer uploaded (a previous leader,
another cluster) join it. Fragments this broker uploaded and verified since a listing began
are kept over that listing (it may have been taken before they landed).

Overlapping fragments (two leaders uploaded different ranges of the same committed offsets,
which are byte-identical on every replica) are resolved by offset coverage, never by reading
them: fragments are ordered by first offset and, for the same first offset, the longest
first; a fragment whose range lies inside what the ones before it cover adds nothing and is
`redundant`. A read of an offset takes the fragment covering it that reaches furthest.

Local segments are merged in by the reader: offsets at or past the local log start are read
from disk, the rest from here.

The index knows both kinds of fragment (jetstream.tiered.names.FragmentKind): segment
fragments, which reads are served from (`covering`, `covers`, `start_offset`, ...), and
Parquet fragments, resolved the same way on their own (`parquet`): a Parquet fragment never
serves a consumer read, and a segment fragment never counts as Parquet coverage.
Pure: no IO, no clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from jetstream.tiered.names import FragmentKind, FragmentName


@dataclass(frozen=True, slots=True)
class StoredFragment:
    """A fragment as the store lists it: its name, its stored (maybe compressed) size and
    when it was last modified there (ms since the Unix epoch)."""

    name: FragmentName
    size_bytes: int
    modified_ms: int

    @property
    def begin(self) -> int:
        return self.name.begin

    @property
    def end(self) -> int:
        return self.name.end


def _order(fragment: StoredFragment) -> tuple[int, int, str]:
    """Fragments in offset order; of two with the same first offset the longer first."""
    return fragment.begin, -fragment.end, fragment.name.sha256


def resolve(fragments: Iterable[StoredFragment]) -> tuple[list[StoredFragment],
                                                           list[StoredFragment]]:
    """(useful, redundant): the fragments that add coverage, in offset order, and those
    whose whole range the useful ones before them already cover."""
    ordered = sorted(fragments, key=_order)
    useful: list[StoredFragment] = []
    redundant: list[StoredFragment] = []
    reach = -1
    for fragment in ordered:
        if fragment.end <= reach:
            redundant.append(fragment)
        else:
            useful.append(fragment)
            reach = fragment.end
    return useful, redundant


class Coverage:
    """The offsets fragments of one kind cover, resolved (see the module docstring)."""

    def __init__(self, fragments: Iterable[StoredFragment] = ()) -> None:
        self.useful, self.redundant = resolve(fragments)
        self._begins = [f.begin for f in self.useful]

    def extended(self, fragment: StoredFragment) -> Coverage | None:
        """This coverage with `fragment` too, when it sorts after every fragment here (an
        upload past the end, the common case): a copy (coverages are shared between an
        index and its snapshots) made without resolving again; None otherwise."""
        last = max(self.useful[-1:] + self.redundant[-1:], key=_order, default=None)
        if last is not None and _order(last) >= _order(fragment):
            return None
        out = Coverage()
        reach = self.useful[-1].end if self.useful else -1
        if fragment.end <= reach:
            out.useful, out._begins = self.useful, self._begins
            out.redundant = [*self.redundant, fragment]
        else:
            out.useful, out._begins = [*self.useful, fragment], [*self._begins, fragment.begin]
            out.redundant = self.redundant
        return out

    def ending_after(self, offset: int) -> list[StoredFragment]:
        """The fragments (useful or redundant) that hold an offset at or past `offset`."""
        # Useful fragments have rising ends: those from the first one ending past `offset`.
        i = bisect.bisect_right(self._begins, offset) - 1
        while i > 0 and self.useful[i - 1].end > offset:
            i -= 1
        useful = self.useful[max(i, 0):]
        return [f for f in useful if f.end > offset] + [
            f for f in self.redundant if f.end > offset]

    def covering(self, offset: int) -> StoredFragment | None:
        """The fragment holding `offset` that reaches furthest, or None."""
        i = bisect.bisect_right(self._begins, offset) - 1
        # Useful fragments have rising ends too, so the last one starting at or below the
        # offset reaches furthest; if it ends before the offset, none covers it.
        if i >= 0 and self.useful[i].end > offset:
            return self.useful[i]
        return None

    def covers(self, begin: int, end: int) -> bool:
        """Whether every offset of [begin, end) is in some fragment."""
        at = begin
        while at < end:
            fragment = self.covering(at)
            if fragment is None:
                return False
            at = fragment.end
        return True

    def run_from(self, begin: int, end: int) -> list[StoredFragment]:
        """The fragments covering [begin, x) without a gap or an overlap (each begins where
        the one before ends; the first holds `begin`), for the largest x they reach up to
        `end` (empty when none holds `begin`), in offset order: together they hold each
        offset of [begin, x) once."""
        out: list[StoredFragment] = []
        at = begin
        while at < end:
            fragment = self.covering(at)
            if fragment is None or (out and fragment.begin != at):
                break
            out.append(fragment)
            at = fragment.end
        return out

    def start_offset(self, upper: int) -> int:
        """The lowest offset from which the fragments cover every offset up to `upper`:
        `upper` itself when no fragment ends at or past it."""
        at = upper
        i = bisect.bisect_left(self._begins, at) - 1
        while i >= 0 and self.useful[i].end >= at:
            at = self.useful[i].begin
            i -= 1
        return at

    @property
    def end_offset(self) -> int | None:
        return self.useful[-1].end if self.useful else None


class FragmentIndex:
    """See the module docstring."""

    def __init__(self, fragments: Iterable[StoredFragment] = ()) -> None:
        self._all: dict[FragmentName, StoredFragment] = {f.name: f for f in fragments}
        #: name -> the generation it was added at by this broker (kept over older listings).
        self._added: dict[FragmentName, int] = {}
        self._generation = 0
        self._segment = Coverage()
        self._parquet = Coverage()
        self._resolve()

    # -- changes ------------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Pass this to `replace_listing` for a listing that begins now."""
        return self._generation

    def replace_listing(self, listed: Iterable[StoredFragment], since_generation: int) -> None:
        """The store listed `listed` in a listing begun at `since_generation`: it replaces
        what the index holds, except fragments added here after the listing began."""
        fresh = {f.name: f for f in listed}
        for name, generation in list(self._added.items()):
            if generation > since_generation and name not in fresh:
                fresh[name] = self._all[name]
            elif name in fresh or generation <= since_generation:
                del self._added[name]
        self._all = fresh
        self._resolve()

    def add(self, fragment: StoredFragment) -> None:
        """This broker verified `fragment` in the store. One past the end of its kind (what
        an offload uploads) extends the coverage without resolving it again: a pass costs
        the same with ten fragments stored or a hundred thousand."""
        self._generation += 1
        known = fragment.name in self._all
        self._all[fragment.name] = fragment
        self._added[fragment.name] = self._generation
        kind = fragment.name.kind
        extended = None if known else (
            self._segment if kind is FragmentKind.SEGMENT else self._parquet).extended(fragment)
        if extended is None:
            self._resolve()
        elif kind is FragmentKind.SEGMENT:
            self._segment = extended
        else:
            self._parquet = extended

    def snapshot(self) -> FragmentIndex:
        """A private copy (an offload pass's, in the executor) that costs a copy of two
        dicts: coverages are never changed in place, only replaced."""
        copy = FragmentIndex()
        copy._all, copy._added = dict(self._all), dict(self._added)
        copy._generation = self._generation
        copy._segment, copy._parquet = self._segment, self._parquet
        return copy

    def ending_after(self, offset: int) -> list[StoredFragment]:
        """The fragments of both kinds, useful or redundant, that hold an offset at or past
        `offset` (what a deletion of local segments from there on can rest on)."""
        return self._segment.ending_after(offset) + self._parquet.ending_after(offset)

    def remove(self, names: Iterable[FragmentName]) -> None:
        """These fragments were deleted from the store (retention, prune)."""
        for name in names:
            self._all.pop(name, None)
            self._added.pop(name, None)
        self._resolve()

    def _resolve(self) -> None:
        kinds: dict[FragmentKind, list[StoredFragment]] = {k: [] for k in FragmentKind}
        for fragment in self._all.values():
            kinds[fragment.name.kind].append(fragment)
        self._segment = Coverage(kinds[FragmentKind.SEGMENT])
        self._parquet = Coverage(kinds[FragmentKind.PARQUET])

    # -- queries (segment fragments but `parquet`, `all`, `size_bytes`) -----------------------

    @property
    def fragments(self) -> list[StoredFragment]:
        """The useful segment fragments, in offset order."""
        return list(self._segment.useful)

    @property
    def redundant(self) -> list[StoredFragment]:
        return list(self._segment.redundant)

    @property
    def parquet(self) -> Coverage:
        """The Parquet fragments."""
        return self._parquet

    def all(self) -> list[StoredFragment]:
        """Every fragment listed, of both kinds, useful or not, in offset order."""
        return sorted(self._all.values(), key=lambda f: (*_order(f), f.name.kind))

    def useful(self) -> set[FragmentName]:
        """The fragments of both kinds that add coverage to their kind."""
        return {f.name for f in (*self._segment.useful, *self._parquet.useful)}

    def __len__(self) -> int:
        return len(self._all)

    @property
    def size_bytes(self) -> int:
        """Stored bytes of every fragment listed."""
        return sum(f.size_bytes for f in self._all.values())

    def covering(self, offset: int) -> StoredFragment | None:
        """The segment fragment holding `offset` that reaches furthest, or None."""
        return self._segment.covering(offset)

    def covers(self, begin: int, end: int) -> bool:
        """Whether every offset of [begin, end) is in some segment fragment."""
        return self._segment.covers(begin, end)

    def start_offset(self, upper: int) -> int:
        """The lowest offset from which the segment fragments cover every offset up to
        `upper` (the local log start): `upper` itself when no fragment ends at or past it."""
        return self._segment.start_offset(upper)

    @property
    def end_offset(self) -> int | None:
        """The end of the furthest segment fragment (None when the store holds none)."""
        return self._segment.end_offset

    @property
    def any_end_offset(self) -> int | None:
        """The end of the furthest fragment of either kind (offsets a new log must not
        reuse)."""
        ends = [e for e in (self._segment.end_offset, self._parquet.end_offset)
                if e is not None]
        return max(ends) if ends else None
