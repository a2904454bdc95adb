"""Ranking tools for a query: BM25F over name, group and description.

    >>> index = ToolIndex(registry.deferred())
    >>> [hit.name for hit in index.search("take a screenshot of the page", limit=2)]
    ['playwright__browser_take_screenshot', 'puppeteer__puppeteer_screenshot']

Each tool is three fields: its name (without the ``<group>__`` prefix, weighed most), its
group, and its description, tokenized with camelCase, snake_case and kebab-case split and
a light English stemmer. BM25F combines the length-normalized, weighted term counts of
the fields before saturating them, and every (term, tool) contribution is computed when
the index is built, so a query costs only the postings of its own terms: a fraction of a
millisecond over 10,000 tools (``bench/tool_search.py``). A query that names a tool
exactly puts it first.

Why our own: ``rank-bm25`` scores every document in Python (2.2 ms p50 over 10,000
tools, over the 2 ms target), and ``bm25s`` is as fast as this index and ranks the
labeled queries the same (within one query) but brings numpy and scipy into the
runtime's dependencies, and neither weighs fields.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from lodger.tools.spec import Tool

__all__ = ["SearchHit", "ToolIndex", "tokenize"]

# ---------------------------------------------------------------- text

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD = re.compile(r"[a-z0-9]+")
# fmt: off
_STOP = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "for", "from", "get",
    "how", "i", "in", "into", "is", "it", "its", "me", "my", "of", "on", "or", "our",
    "please", "that", "the", "their", "them", "then", "this", "to", "use", "using", "want",
    "we", "what", "when", "which", "with", "you", "your",
))
# fmt: on


@lru_cache(maxsize=65_536)
def _stem(word: str) -> str:
    """A light suffix stripper: plurals, -ing, -ed, -e (``creating``/``created`` -> ``creat``)."""
    if len(word) <= 3 or word.isdigit():
        return word
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", "e")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + keep
            break
    else:
        if word.endswith("s") and not word.endswith(("ss", "us", "is")):
            word = word[:-1]
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """Lowercased, stemmed words; camelCase, snake_case and kebab-case split apart."""
    words = _WORD.findall(_CAMEL.sub(r"\1 \2", text).lower())
    return [_stem(w) for w in words if w not in _STOP]


# ---------------------------------------------------------------- ranking


@dataclass(frozen=True, kw_only=True)
class SearchHit:
    name: str
    score: float
    tool: Tool


@dataclass(frozen=True)
class _Field:
    weight: float
    b: float  # how much the field's length normalizes its term counts


NAME, GROUP, DESCRIPTION = _Field(3.0, 0.3), _Field(1.5, 0.0), _Field(1.0, 0.75)
K1 = 1.2


def _name_words(t: Tool) -> str:
    # ``git__git_log`` is ``git_log`` of group ``git``: the prefix is the group's business.
    prefix = f"{t.group}__"
    return t.name[len(prefix) :] if t.name.startswith(prefix) else t.name


class ToolIndex:
    """BM25F over name, group and description, as an inverted index of precomputed
    per-(term, tool) contributions. Ties break by name, so rankings are deterministic."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self.tools = sorted(tools, key=lambda t: t.name)
        self._doc = {t.name: doc for doc, t in enumerate(self.tools)}
        docs = [
            (
                (NAME, Counter(tokenize(_name_words(t)))),
                (GROUP, Counter(tokenize(t.group))),
                (DESCRIPTION, Counter(tokenize(t.description))),
            )
            for t in self.tools
        ]
        n = max(len(docs), 1)
        average = {
            field: max(sum(sum(d[i][1].values()) for d in docs) / n, 1.0)
            for i, field in enumerate((NAME, GROUP, DESCRIPTION))
        }
        pseudo: list[dict[str, float]] = []
        df: Counter[str] = Counter()
        for fields in docs:
            weighted: dict[str, float] = {}
            for field, counts in fields:
                norm = 1 - field.b + field.b * sum(counts.values()) / average[field]
                for term, tf in counts.items():
                    weighted[term] = weighted.get(term, 0.0) + field.weight * tf / norm
            pseudo.append(weighted)
            df.update(weighted.keys())
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for doc, weighted in enumerate(pseudo):
            for term, weight in weighted.items():
                idf = math.log(1 + (len(docs) - df[term] + 0.5) / (df[term] + 0.5))
                self._postings.setdefault(term, []).append((doc, idf * weight / (K1 + weight)))

    def __len__(self) -> int:
        return len(self.tools)

    def get(self, name: str) -> Tool | None:
        doc = self._doc.get(name)
        return None if doc is None else self.tools[doc]

    def search(self, query: str, *, limit: int = 5) -> list[SearchHit]:
        """The best ``limit`` tools for ``query``, best first (tools sharing no term: none)."""
        scores: dict[int, float] = {}
        for term, times in Counter(tokenize(query)).items():
            for doc, contribution in self._postings.get(term, ()):
                scores[doc] = scores.get(doc, 0.0) + times * contribution
        # A query naming a tool exactly (``git__git_log``) wants that tool first.
        for word in query.split():
            exact = self._doc.get(word.strip(" ,.;:'\"`"))
            if exact is not None:
                scores[exact] = scores.get(exact, 0.0) + 100.0
        best = heapq.nlargest(limit, scores.items(), key=lambda item: (item[1], -item[0]))
        return [SearchHit(name=self.tools[d].name, score=s, tool=self.tools[d]) for d, s in best]
