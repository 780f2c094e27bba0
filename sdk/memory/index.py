"""The retriever's lexical index: exact top-k by Jaccard x weight without scoring every match.

An entry's score for a query is ``c / (n + m - c) * w``: Jaccard over content words (``c``
shared, ``n`` query words, ``m`` entry words) times its weight ``w = max(confidence, 0.05)``.
Two things keep a query's work away from the size of the memory:

- **Entries with the same words share one class.** Jaccard depends only on the word set, so
  it is computed once per distinct set; the members of a class are kept in
  ``(-weight, id)`` order, which is exactly their score order, and only the first few are
  ever looked at. Posting lists hold class numbers, not entries.
- **MaxScore over the query's words.** Lists are visited rarest first. After each one the
  k-th best exact score so far (``theta``) is compared with the best score any class outside
  the visited lists could reach: it shares at most ``r`` words (the unvisited lists), so it
  scores at most ``r / n * max weight``. Once that is below ``theta`` the long lists of
  common words are never read, only probed (binary search) for the candidates' exact counts.

Both bounds are computed with the same floating-point operations as the scores (division
and multiplication are monotone under IEEE rounding), so pruning never drops an entry the
exhaustive ranking would keep, and ties go to the smaller id as they do there.
"""

from __future__ import annotations

import bisect
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from evoharness.harness.text import content_words

if TYPE_CHECKING:
    from evoharness.sdk.memory.entries import MemoryEntry

_LAST_ID = chr(0x10FFFF)  # sorts after every id
COMPACT_AT = 1024
"""Empty classes tolerated before a rebuild (and at least as many as live classes)."""


def weight(confidence: float) -> float:
    """An entry's ranking weight: its confidence, never below 0.05."""
    return max(confidence, 0.05)


IN_SCOPE = 1e-12
"""The least relevance of an entry scoped to the session's own case pattern: any (it shares
the pattern's words with the query, so its score is above zero)."""


class LexicalIndex:
    """One kind's entries, grouped by word set, with per-word lists of class numbers.

    Class numbers grow as new word sets arrive, so every list is ascending and can be
    probed with a binary search. A class whose last member left stays (weight 0: it can
    never reach ``at_least``, which is > 0) until :meth:`compacted` rebuilds the lists.
    """

    def __init__(self) -> None:
        self.class_of: dict[frozenset[str], int] = {}
        self.class_words: list[frozenset[str]] = []
        self.sizes = array("d")  # class -> number of words
        self.best = array("d")  # class -> its best member's weight; 0.0 when empty
        self.members: list[list[tuple[float, str]]] = []  # class -> sorted (-weight, id)
        self.lists: dict[str, array[int]] = {}  # word -> ascending class numbers
        # every class's words as numbers, back to back (class c: starts[c], sizes[c] long):
        # a candidate's exact shared count is a gather from here, whatever the query
        self.vocab: dict[str, int] = {}
        self.word_ids = array("q")
        self.starts = array("q")
        self.where: dict[str, tuple[int, float]] = {}  # entry id -> (class, weight)
        self.empty = 0
        self._max_weight: float | None = 0.0

    def __len__(self) -> int:
        return len(self.where)

    def add(self, entry_id: str, found: frozenset[str], w: float) -> None:
        """Index an entry with content words ``found`` and weight ``w`` (not yet indexed)."""
        c = self.class_of.get(found)
        if c is None:
            c = self.class_of[found] = len(self.class_words)
            self.class_words.append(found)
            self.sizes.append(float(len(found)))
            self.best.append(0.0)
            self.members.append([])
            self.starts.append(len(self.word_ids))
            for word in found:
                self.word_ids.append(self.vocab.setdefault(word, len(self.vocab)))
                slots = self.lists.get(word)
                if slots is None:
                    slots = self.lists[word] = array("q")
                slots.append(c)
        elif not self.members[c]:
            self.empty -= 1
        bisect.insort(self.members[c], (-w, entry_id))
        self.best[c] = -self.members[c][0][0]
        self.where[entry_id] = (c, w)
        if self._max_weight is not None:
            self._max_weight = max(self._max_weight, w)

    def remove(self, entry_id: str) -> None:
        """Forget an entry (nothing happens for an unknown id)."""
        found = self.where.pop(entry_id, None)
        if found is None:
            return
        c, w = found
        members = self.members[c]
        del members[bisect.bisect_left(members, (-w, entry_id))]
        self.best[c] = -members[0][0] if members else 0.0
        if not members:
            self.empty += 1
        if w == self._max_weight:
            self._max_weight = None  # recomputed on the next query

    def max_weight(self) -> float:
        """The largest weight of any indexed entry (0.0 when empty)."""
        if self._max_weight is None:
            self._max_weight = float(np.max(self.best)) if len(self.best) else 0.0
        return self._max_weight

    def compacted(self) -> LexicalIndex:
        """This index, or a rebuilt copy without empty classes once they outnumber live
        ones (and :data:`COMPACT_AT`); classes keep their relative order."""
        if self.empty <= max(COMPACT_AT, len(self.class_words) - self.empty):
            return self
        fresh = LexicalIndex()
        for c, found in enumerate(self.class_words):
            for neg_w, entry_id in self.members[c]:
                fresh.add(entry_id, found, -neg_w)
        return fresh

    def top(self, query: frozenset[str], k: int, at_least: float) -> list[str]:
        """Ids of the ``k`` best entries by Jaccard(query, entry words) x weight, best first
        (ties by id), each scoring at least ``at_least`` (> 0) (see :meth:`scored`)."""
        return [i for _, i in self.scored(query, k, at_least)]

    def scored(self, query: frozenset[str], k: int, at_least: float) -> list[tuple[float, str]]:
        """``(score, id)`` of the ``k`` best entries by Jaccard(query, entry words) x
        weight, best first (ties by id), each scoring at least ``at_least`` (> 0).

        Two passes: the rarest word's classes give a first ``theta``; that fixes how many
        of the rarer lists can hold an entry reaching it (a class outside them shares at
        most the ``r`` other words: ``r / n * max weight``). Of those lists' classes only
        the ones that could still reach ``theta`` (counting how many visited lists hold
        them, plus ``r``) are ranked exactly. ``theta`` only grows with more candidates,
        so the second pass needs no third.
        """
        n = len(query)
        parts = sorted(
            (np.frombuffer(self.lists[w], dtype=np.int64) for w in query if w in self.lists),
            key=len,
        )
        if not parts:
            return []
        mask = np.zeros(len(self.vocab), dtype=bool)
        mask[[self.vocab[w] for w in query if w in self.vocab]] = True
        top = self._rank(parts[0], mask, n, k, at_least)
        w_max = self.max_weight()
        theta = -top[k - 1][0] if len(top) >= k else at_least
        visit = 1
        while visit < len(parts) and (len(parts) - visit) / n * w_max >= theta:
            visit += 1
        if visit == 1:
            return [(-neg, i) for neg, i in top[:k]]
        # the classes of the visited lists, with how many of those lists hold each; with
        # the r lists not visited a class shares at most min(seen + r, its size) words
        both = np.concatenate(parts[:visit])
        if len(both) * 8 < len(self.class_words):
            classes, seen = np.unique(both, return_counts=True)
        else:
            counts = np.bincount(both)
            classes = np.flatnonzero(counts)
            seen = counts[classes]
        sizes = np.frombuffer(self.sizes, dtype=np.float64)[classes]
        most = np.minimum(seen + (len(parts) - visit), sizes)
        bound = most / (n + sizes - most) * np.frombuffer(self.best, dtype=np.float64)[classes]
        keep = classes[bound >= theta]
        return [(-neg, i) for neg, i in self._rank(keep, mask, n, k, at_least)]

    def _rank(
        self,
        classes: Any,
        mask: Any,
        n: int,
        k: int,
        at_least: float,
    ) -> list[tuple[float, str]]:
        """The k best ``(-score, id)`` of the members of ``classes`` (distinct): exact
        Jaccard per class (its words gathered and checked against the query ``mask``),
        then members only of classes whose best member can reach the k best."""
        if not len(classes):
            return []
        sizes = np.frombuffer(self.sizes, dtype=np.float64)[classes]
        lengths = sizes.astype(np.int64)
        ends = np.cumsum(lengths)
        at = np.repeat(
            np.frombuffer(self.starts, dtype=np.int64)[classes] - ends + lengths, lengths
        )
        at += np.arange(int(ends[-1]))
        found = mask[np.frombuffer(self.word_ids, dtype=np.int64)[at]]
        owner = np.repeat(np.arange(len(classes)), lengths)
        shared = np.bincount(owner[found], minlength=len(classes)).astype(np.float64)
        jaccard = shared / (n + sizes - shared)
        bound = jaccard * np.frombuffer(self.best, dtype=np.float64)[classes]
        cutoff = at_least
        if len(bound) > k:  # the k best classes' best members already give k scores
            cutoff = max(cutoff, float(np.partition(bound, len(bound) - k)[len(bound) - k]))
        pick = np.flatnonzero(bound >= cutoff)
        return self._merge(classes[pick].tolist(), jaccard[pick].tolist(), k, at_least)

    def _merge(
        self,
        classes: list[int],
        jaccards: list[float],
        k: int,
        at_least: float,
    ) -> list[tuple[float, str]]:
        """The k best ``(-score, id)`` of the members of ``classes`` (Jaccard ``jaccards``)."""
        out: list[tuple[float, str]] = []
        for c, jac in zip(classes, jaccards, strict=True):
            members = self.members[c]
            at, last, taken = 0, 0.0, 0
            while at < len(members):
                neg_w = members[at][0]
                score = jac * -neg_w
                if score < at_least or (taken >= k and score < last):
                    break  # members come in score order: the rest score less
                # members of one weight tie on score: only their k smallest ids can count
                end = bisect.bisect_right(members, (neg_w, _LAST_ID), lo=at)
                out += [(-score, i) for _, i in members[at : min(end, at + k)]]
                at, last, taken = end, score, taken + min(end - at, k)
        out.sort()
        return out[:k]


class MemoryIndex:
    """Live entries by id, one :class:`LexicalIndex` per ranked kind, preferences per user.

    Each entry's words are computed once, when it is indexed (the shared ``content_words``
    cache holds 4,096 texts: at memory scale it would only thrash). With ``scoped``, each
    kind also has one index per case pattern (an entry is in the index of each of its
    :attr:`~evoharness.sdk.memory.entries.MemoryEntry.scopes`, a pattern-free entry in
    the ``""`` one), so a query of one case ranks only the entries that apply to it. In a
    pattern's index an entry's words include the pattern's, and so do the query's: an entry
    learned for the session's own pattern is relevant to it even when its text shares no
    word with the request (the pattern is no longer part of a lesson's text).
    """

    def __init__(self, *, scoped: bool = False) -> None:
        self.entries: dict[str, MemoryEntry] = {}
        self.postings: dict[str, LexicalIndex] = {
            "strategy": LexicalIndex(),
            "lesson": LexicalIndex(),
        }
        self.scoped = scoped
        self.by_scope: dict[tuple[str, str], LexicalIndex] = {}  # (kind, pattern or "")
        self.preferences: dict[str, list[str]] = {}  # user id -> entry ids, in order

    def ranked(self, entry_id: str) -> bool:
        """Whether ``entry_id`` is a live, lexically indexed strategy or lesson."""
        return any(entry_id in p.where for p in self.postings.values())

    def remove(self, entry_id: str) -> None:
        """Take an entry out (nothing happens for an unknown id)."""
        old = self.entries.pop(entry_id, None)
        if old is None:
            return
        if old.kind == "preference":
            mine = self.preferences.get(old.user_id) if old.user_id is not None else None
            if mine is not None and entry_id in mine:
                mine.remove(entry_id)
            return
        self.postings[old.kind].remove(entry_id)
        if self.scoped:
            for scope in old.scopes or [""]:
                self.by_scope[(old.kind, scope)].remove(entry_id)

    def add(self, entry: MemoryEntry, found: frozenset[str]) -> None:
        """Index ``entry`` (replacing an earlier version) whose text has words ``found``;
        retired entries are only taken out."""
        self.remove(entry.id)
        if entry.retired:
            return
        self.entries[entry.id] = entry
        if entry.kind == "preference":
            if entry.user_id is not None:
                bisect.insort(self.preferences.setdefault(entry.user_id, []), entry.id)
            return
        w = weight(entry.confidence)
        self.postings[entry.kind].add(entry.id, found, w)
        if self.scoped:
            for scope in entry.scopes or [""]:
                index = self.by_scope.setdefault((entry.kind, scope), LexicalIndex())
                index.add(entry.id, found | content_words(scope) if scope else found, w)

    def top(
        self, kind: str, query: frozenset[str], k: int, at_least: float, case: str | None = None
    ) -> list[str]:
        """Ids of the ``k`` best ``kind`` entries for ``query`` (:meth:`LexicalIndex.top`);
        with ``case`` (a scoped index only), of the entries that apply to that case: its
        pattern's and the pattern-free ones, ranked together. An entry scoped to the case
        is relevant by its scope (``at_least`` applies to the pattern-free ones): evolve
        learned it for that pattern, and a lesson ("finish by calling the summary tool")
        rarely shares a word with a request beyond the pattern."""
        if case is None:
            return self.postings[kind].top(query, k, at_least)
        if not self.scoped:
            raise ValueError("a case needs a scoped index (MemoryIndex(scoped=True))")
        found = [
            (-score, i)
            for scope in dict.fromkeys((case, ""))
            if (index := self.by_scope.get((kind, scope))) is not None
            for score, i in index.scored(
                query | content_words(scope) if scope else query,
                k,
                IN_SCOPE if scope else at_least,
            )
        ]
        return [i for _, i in sorted(found)[:k]]

    def compact(self) -> None:
        """Rebuild a kind's lists once empty classes outnumber live ones (amortised O(1)
        per change)."""
        for kind, postings in self.postings.items():
            self.postings[kind] = postings.compacted()
        for key, index in self.by_scope.items():
            self.by_scope[key] = index.compacted()
