"""The hybrid tool ranker: the lexical index fused with a local static embedding model.

    >>> index = HybridIndex(registry.deferred(), embedder=load_embedder())
    >>> [hit.name for hit in index.search("what JavaScript errors has the page logged")]

Lexical ranking misses a request that shares no word with the tool that does it ("what's
on my plate this sprint" for ``getCycleIssues``); a word-embedding model puts such words
near each other. The model is static (a token embedding table averaged over the text: no
transformer runs), so a query costs tens of microseconds to embed and one matrix-vector
product over the catalog. It ships inside a PyPI wheel (``wordllama``, installed by the
``lodger[semantic]`` extra) and is loaded from the installed package with downloads
disabled: nothing is fetched at run time. Without the extra, ``load_embedder()`` is None
and ``tool_search`` ranks lexically.

The two are fused by score: a tool's BM25F score over the best tool's, plus a weight
times its cosine similarity (on the dev half this beat reciprocal rank fusion, which
dropped recall@5 below the lexical ranker's, and scaling the similarities by the best
one's or to z-scores), plus a weight times its server's BM25 score (``ServerIndex``: the
server's definitions as one document), which raises the tools of the server a request
is about. A catalog's embeddings are computed once and cached in memory
by the digest of the model and the texts embedded, so a tool set bound again (a new
run, another session over the same MCP servers) reuses them.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lodger._core.extras import require
from lodger.tools.ranking import (
    EXACT_BONUS,
    FITTED,
    FieldWeights,
    SearchHit,
    ServerIndex,
    ToolIndex,
    query_terms,
    tool_fields,
)
from lodger.tools.spec import Tool

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["Embedder", "HybridIndex", "WordLlamaEmbedder", "load_embedder"]


class Embedder(Protocol):
    """Texts to unit-length vectors, one row per text, offline."""

    @property
    def name(self) -> str:
        """Identifies the model: part of the cache key of a catalog's embeddings."""
        ...

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]: ...


class WordLlamaEmbedder:
    """WordLlama's 256-dimension model, read from the files its wheel ships."""

    name = "wordllama-l2_supercat-256"

    def __init__(self) -> None:
        with require("semantic", "the semantic tool_search ranker"):
            import wordllama
            from wordllama import WordLlama

        # The package looks for its files under ``cache_dir/{weights,tokenizers}``; its
        # own directory has both. ``disable_download`` makes a missing file an error
        # instead of a fetch from a model hub.
        here = Path(wordllama.__file__).parent
        self._model: Any = WordLlama.load(cache_dir=here, disable_download=True)

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        import numpy as np

        raw = np.asarray(self._model.embed(list(texts), norm=False), dtype=np.float32)
        vectors = raw.reshape(len(texts), -1)
        # Unit length, except a text with no known token, which stays all zeros (similar to
        # nothing) instead of dividing by zero.
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit: NDArray[np.float32] = np.divide(
            vectors, norms, out=np.zeros_like(vectors), where=norms > 0
        )
        return unit


_EMBEDDER: list[Embedder | None] = []
_EMBEDDER_LOCK = threading.Lock()


def load_embedder() -> Embedder | None:
    """The packaged embedding model (loaded once per process), or None when the
    ``semantic`` extra is not installed."""
    with _EMBEDDER_LOCK:
        if not _EMBEDDER:
            try:
                embedder: Embedder | None = WordLlamaEmbedder()
            except ImportError:
                embedder = None
            _EMBEDDER.append(embedder)
        return _EMBEDDER[0]


# ---------------------------------------------------------------- the catalog's vectors

_CACHE: OrderedDict[str, Any] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_ENTRIES = 16


def _embedding_text(t: Tool) -> str:
    name, group, description, parameters, _ = tool_fields(t)
    words = f"{name.replace('_', ' ').replace('-', ' ')} {group}"
    # The first sentences say what a tool does; usage notes further on blur the vector.
    return f"{words}. {' '.join(description.split())[:400]} {parameters}"


def catalog_vectors(tools: Sequence[Tool], embedder: Embedder) -> tuple[str, NDArray[np.float32]]:
    """The embeddings of ``tools`` (one row each, in order), cached by their digest."""
    texts = [_embedding_text(t) for t in tools]
    h = hashlib.sha256(embedder.name.encode())
    for text in texts:
        h.update(b"\0" + text.encode("utf-8", "surrogatepass"))
    digest = h.hexdigest()
    with _CACHE_LOCK:
        cached = _CACHE.get(digest)
        if cached is not None:
            _CACHE.move_to_end(digest)
            return digest, cached
    vectors = embedder.embed(texts) if texts else _empty()
    with _CACHE_LOCK:
        _CACHE[digest] = vectors
        while len(_CACHE) > _CACHE_ENTRIES:
            _CACHE.popitem(last=False)
    return digest, vectors


def _empty() -> NDArray[np.float32]:
    import numpy as np

    return np.zeros((0, 1), dtype=np.float32)


# ---------------------------------------------------------------- fusion

# Fitted on the dev half of bench/data: a tool's fused score is its BM25F score over the
# best one's, plus ``SEMANTIC_WEIGHT`` times its cosine similarity to the query, plus
# ``SERVER_WEIGHT`` times its server's BM25 score over the best server's (``ServerIndex``).
# The two weights were learned together (pairwise logistic loss, pulled toward the fusion
# before them, 0.4 and 0; bench/tool_search_learned.py, which cross-validates it in dev).
SEMANTIC_WEIGHT = 0.75
SERVER_WEIGHT = 0.19
# A tool that shares no word with the query is a match only this near to it: below, a
# query of unknown words ("zzzz") would still "find" its nearest neighbours.
MIN_SIMILARITY = 0.25


class HybridIndex:
    """Lexical BM25F and embedding similarity, fused. Same surface as ``ToolIndex``
    (``tools``, ``get``, ``search``); ties break by name."""

    def __init__(
        self,
        tools: Iterable[Tool],
        *,
        embedder: Embedder,
        weights: FieldWeights = FITTED,
        semantic_weight: float = SEMANTIC_WEIGHT,
        server_weight: float = SERVER_WEIGHT,
    ) -> None:
        self.lexical = ToolIndex(tools, weights=weights)
        self.tools = self.lexical.tools
        self.embedder = embedder
        self.semantic_weight = semantic_weight
        self.server_weight = server_weight
        self.servers = ServerIndex(self.tools) if server_weight > 0 else None
        self.digest, self._vectors = catalog_vectors(self.tools, embedder)
        import numpy as np

        group_of = self.servers.group_of if self.servers is not None else []
        self._group_of = np.asarray(group_of, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.tools)

    def get(self, name: str) -> Tool | None:
        return self.lexical.get(name)

    def similarities(self, query: str) -> NDArray[np.float32]:
        """Cosine similarity of every tool (in ``tools`` order) to ``query``."""
        import numpy as np

        # Not ``@``: a matrix-vector product goes to the BLAS library's thread pool, whose
        # threads fall asleep between searches and, on a busy machine, take milliseconds
        # to wake (p50 11 ms over 10,000 tools, against 2.6 ms on one thread). einsum's
        # own loop runs on the calling thread.
        query_vector = self.embedder.embed([query])[0]
        similarities: NDArray[np.float32] = np.einsum("ij,j->i", self._vectors, query_vector)
        return similarities

    def fused_scores(self, query: str) -> tuple[NDArray[np.float32], NDArray[np.bool_]]:
        """Every tool's fused score (in ``tools`` order), and which tools match at all:
        a word in common with ``query``, or a cosine similarity of ``MIN_SIMILARITY``."""
        import numpy as np

        similarities = self.similarities(query)
        fused = similarities * np.float32(self.semantic_weight)
        matched = similarities >= np.float32(MIN_SIMILARITY)
        lexical = self.lexical.scores(query)
        if lexical:
            top = max(lexical.values())
            docs = np.fromiter(lexical.keys(), dtype=np.int64, count=len(lexical))
            values = np.fromiter(lexical.values(), dtype=np.float32, count=len(lexical))
            fused[docs] += values / np.float32(top)
            matched[docs] = True
        if self.servers is not None:
            by_group = self.servers.scores(query_terms(query, related=self.lexical.weights.related))
            if any(by_group):
                servers = np.asarray(by_group, dtype=np.float32)[self._group_of]
                fused += servers * np.float32(self.server_weight)
        for doc in self.lexical.exact(query):
            fused[doc] += np.float32(EXACT_BONUS)
        return fused, matched

    def search(self, query: str, *, limit: int = 5) -> list[SearchHit]:
        import numpy as np

        if not self.tools or limit <= 0:
            return []
        fused, matched = self.fused_scores(query)
        candidates = np.flatnonzero(matched)
        n = min(limit, len(candidates))
        if n == 0:
            return []
        scores = fused[candidates]
        top_n = candidates[np.argpartition(-scores, n - 1)[:n]]
        best = sorted(((float(fused[d]), int(d)) for d in top_n), key=lambda x: (-x[0], x[1]))
        return [SearchHit(name=self.tools[d].name, score=s, tool=self.tools[d]) for s, d in best]
