# Every closure below is called before its loop moves on (rankings are computed at once).
# ruff: noqa: B023
"""An experiment harness, not a lodger feature: ranking ideas judged on the DEV half only.

It never reads the test half of ``bench/data/tool_search_requests.json`` (requests are
filtered to ``split == "dev"`` on load). Every idea with a fitted parameter is judged by
repeated k-fold cross-validation inside dev (2 folds unless ``--folds``): the dev requests
are shuffled into folds (``--repeats`` times, fixed seeds); for each fold, the candidate
setting with the best objective (recall@5 + MRR/2) on the other folds is chosen, and the
fold is scored with it. Each request is so scored by a setting chosen without it; the
figures are averaged over the repeats. An idea with no parameter is scored on all of dev.

The hand-written related-word lists of ``lodger.tools.ranking`` were written while looking
at dev, so dev cannot show what an idea does for wording no list covers; rows marked
``[no hand lists]`` run the same idea with those lists off, as a stand-in for unseen
wording. A change was kept only when, over the four checks (lexical and hybrid, with and
without the lists), recall@5 and MRR both rose in sum and no check lost more than one
request at recall@5.

    python bench/tool_search_cv.py [--repeats 10] [--folds 2] [--only IDEA]

Printed: one row per idea (dev recall@1 / recall@5 / MRR, CV or whole-dev), the settings
CV chose most often, and a last line of JSON with every figure and its recall@5 ratio to
the shipped lexical ranker's on all of dev (the baseline, measured in the same run).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from lodger.runtime.config import load_catalog
from lodger.tools.ranking import FITTED, FieldWeights, ToolIndex
from lodger.tools.semantic import HybridIndex, load_embedder

HELD_OUT = Path(__file__).resolve().parent / "data"
Metrics = tuple[float, float, float]  # hit@1, hit@5, reciprocal rank (top 10)


def dev_requests() -> list[dict[str, Any]]:
    requests = json.loads((HELD_OUT / "tool_search_requests.json").read_text())
    return [q for q in requests if q["split"] == "dev"]


def per_request(ranked: Sequence[str], expected: Sequence[str]) -> Metrics:
    for i, name in enumerate(ranked[:10]):
        if name in expected:
            return float(i == 0), float(i < 5), 1 / (i + 1)
    return 0.0, 0.0, 0.0


def evaluate(search: Callable[[str], Sequence[str]], dev: Sequence[dict[str, Any]]) -> np.ndarray:
    """Per-request metrics: one row (hit@1, hit@5, rr) per dev request."""
    return np.array([per_request(search(q["query"]), q["expected"]) for q in dev])


def objective(rows: np.ndarray) -> float:
    return float(rows[:, 1].mean() + 0.5 * rows[:, 2].mean())


FOLDS = 2


def cross_validate(
    candidates: dict[str, np.ndarray], repeats: int, folds: int | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """Mean (recall@1, recall@5, MRR) over repeats of k-fold CV selecting among
    ``candidates`` (setting -> per-request rows), and how often each setting was chosen."""
    folds = folds or FOLDS
    labels = list(candidates)
    stack = np.stack([candidates[k] for k in labels])  # settings x requests x 3
    n = stack.shape[1]
    chosen: dict[str, int] = {}
    results = []
    for r in range(repeats):
        order = list(range(n))
        random.Random(1000 + r).shuffle(order)
        fold_of = np.empty(n, dtype=int)
        for i, j in enumerate(order):
            fold_of[j] = i % folds
        scored = np.zeros((n, 3))
        for f in range(folds):
            train = fold_of != f
            objs = stack[:, train, 1].mean(axis=1) + 0.5 * stack[:, train, 2].mean(axis=1)
            best = int(np.argmax(objs))  # ties: the first listed (the simpler setting)
            chosen[labels[best]] = chosen.get(labels[best], 0) + 1
            scored[~train] = stack[best, ~train]
        results.append(scored.mean(axis=0))
    return np.mean(results, axis=0), chosen


# ---------------------------------------------------------------- lexical ideas


class Forward:
    """A ToolIndex's postings turned around: each tool's (term -> contribution)."""

    def __init__(self, index: ToolIndex) -> None:
        self.index = index
        self.terms: list[dict[str, float]] = [{} for _ in index.tools]
        for term, postings in index._postings.items():
            for doc, c in postings:
                self.terms[doc][term] = c
        self.group = [t.group for t in index.tools]

    def base(self, query: str) -> dict[int, float]:
        return self.index.scores(query)

    def prf(self, query: str, k: int, m: int, lam: float) -> dict[int, float]:
        """RM3-style: the top ``k`` tools' own terms, weighted by their score share,
        the best ``m`` not in the query added at ``lam`` of the query's weight."""
        scores = self.index.scores(query)
        if not scores or lam == 0:
            return scores
        top = heapq.nlargest(k, scores.items(), key=lambda x: (x[1], -x[0]))
        total = sum(s for _, s in top) or 1.0
        mass: dict[str, float] = {}
        for doc, s in top:
            vec = self.terms[doc]
            norm = sum(vec.values()) or 1.0
            for term, c in vec.items():
                mass[term] = mass.get(term, 0.0) + (s / total) * c / norm
        own = set(self.index_terms(query))
        extra = heapq.nlargest(
            m, ((t, w) for t, w in mass.items() if t not in own), key=lambda x: x[1]
        )
        if not extra:
            return scores
        top_w = extra[0][1]
        out = dict(scores)
        for term, w in extra:
            for doc, c in self.index._postings.get(term, ()):
                out[doc] = out.get(doc, 0.0) + lam * (w / top_w) * c
        return out

    def index_terms(self, query: str) -> list[str]:
        from lodger.tools.ranking import query_terms

        return list(query_terms(query, related=self.index.weights.related))

    def group_prior(self, query: str, k: int, beta: float) -> dict[int, float]:
        """Tools of the groups holding the top ``k`` results' score mass are raised by
        ``beta`` times that group's share of it (of their own score)."""
        scores = self.index.scores(query)
        if not scores or beta == 0:
            return scores
        top = heapq.nlargest(k, scores.items(), key=lambda x: (x[1], -x[0]))
        total = sum(s for _, s in top) or 1.0
        share: dict[str, float] = {}
        for doc, s in top:
            share[self.group[doc]] = share.get(self.group[doc], 0.0) + s / total
        return {d: s * (1 + beta * share.get(self.group[d], 0.0)) for d, s in scores.items()}


def ranked(index: ToolIndex, scores: dict[int, float], query: str) -> list[str]:
    for doc in index.exact(query):
        scores[doc] = scores.get(doc, 0.0) + 100.0
    best = heapq.nlargest(10, scores.items(), key=lambda x: (x[1], -x[0]))
    return [index.tools[d].name for d, _ in best]


def lexical_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shipped = ToolIndex(catalog)
    fwd = Forward(shipped)
    base = evaluate(lambda q: ranked(shipped, fwd.base(q), q), dev)
    out["lexical (shipped FITTED)"] = {"dev": base.mean(axis=0), "cv": None}

    # Ablations (no parameter: whole dev).
    for label, w in (
        ("  without related words", replace(FITTED, related=0.0)),
        ("  without group boost", replace(FITTED, group_boost=0.0)),
        ("  without action boost", replace(FITTED, action_boost=0.0)),
    ):
        idx = ToolIndex(catalog, weights=w)
        out[label] = {
            "dev": evaluate(lambda q, i=idx: [h.name for h in i.search(q, limit=10)], dev).mean(
                axis=0
            ),
            "cv": None,
        }

    # PRF, fitted by CV (lam 0 = the shipped ranker is a candidate).
    cands = {"lam=0": base}
    for k in (3, 5, 10):
        for m in (5, 10, 20):
            for lam in (0.1, 0.2, 0.3, 0.5):
                cands[f"k={k} m={m} lam={lam}"] = evaluate(
                    lambda q, k=k, m=m, lam=lam: ranked(shipped, fwd.prf(q, k, m, lam), q), dev
                )
    cv, chosen = cross_validate(cands, repeats)
    best = max(cands, key=lambda c: objective(cands[c]))
    out["PRF (RM3-style), CV"] = {
        "cv": cv,
        "chosen": chosen,
        "best_on_all_dev": (best, cands[best].mean(axis=0)),
    }

    # Group prior from the top results, fitted by CV.
    cands = {"beta=0": base}
    for k in (3, 5, 10):
        for beta in (0.1, 0.2, 0.3, 0.5, 1.0):
            cands[f"k={k} beta={beta}"] = evaluate(
                lambda q, k=k, beta=beta: ranked(shipped, fwd.group_prior(q, k, beta), q), dev
            )
    cv, chosen = cross_validate(cands, repeats)
    best = max(cands, key=lambda c: objective(cands[c]))
    out["group prior from top-k, CV"] = {
        "cv": cv,
        "chosen": chosen,
        "best_on_all_dev": (best, cands[best].mean(axis=0)),
    }

    # BM25F weights refit: the fitting procedure itself under CV (shipped weights are a
    # candidate; others: random perturbations). Its CV figure is the honest estimate of
    # "weights fitted on dev" on unseen requests.
    rng = random.Random(7)
    cands = {"shipped": base}
    for i in range(60):
        w = FieldWeights(
            name=rng.choice((2.0, 3.0, 4.0, 5.0)),
            group=rng.choice((1.0, 2.0, 3.0)),
            description=1.0,
            parameters=rng.choice((0.3, 0.6, 1.0)),
            parameter_text=rng.choice((0.3, 0.5, 0.7, 1.0)),
            summary=rng.choice((1.0, 2.0, 3.0)),
            name_b=rng.choice((0.0, 0.3)),
            description_b=rng.choice((0.5, 0.75, 0.9)),
            parameter_b=rng.choice((0.5, 0.75)),
            k1=rng.choice((1.2, 1.6, 2.0, 3.0)),
            related=rng.choice((0.5, 0.7)),
            group_boost=rng.choice((0.5, 1.0)),
            action_boost=rng.choice((0.0, 0.1, 0.2)),
        )
        idx = ToolIndex(catalog, weights=w)
        cands[f"random {i}"] = evaluate(
            lambda q, i=idx: [h.name for h in i.search(q, limit=10)], dev
        )
    cv, chosen = cross_validate(cands, repeats)
    out["BM25F weights refit (random search), CV"] = {"cv": cv, "chosen": chosen}
    return out


# ---------------------------------------------------------------- hybrid ideas


class Vectors:
    """Embeddings of the catalog and the queries with the packaged model's own table,
    pooled in several ways."""

    def __init__(self, texts: Sequence[str], queries: Sequence[str], dims: int = 256) -> None:
        embedder = load_embedder()
        assert embedder is not None
        model = embedder._model  # type: ignore[attr-defined]
        self.table = np.asarray(model.embedding, dtype=np.float32)[:, :dims]
        self.tok = model.tokenizer
        self.doc_ids = [self.ids(t) for t in texts]
        self.query_ids = {q: self.ids(q) for q in queries}
        df: dict[int, int] = {}
        for ids in self.doc_ids:
            for i in set(ids):
                df[i] = df.get(i, 0) + 1
        self.df = df
        self.n = len(texts)

    def ids(self, text: str) -> list[int]:
        enc = self.tok.encode_batch([text], add_special_tokens=False)[0]
        return [i for i, m in zip(enc.ids, enc.attention_mask, strict=True) if m]

    def weight(self, ids: Sequence[int], how: str) -> np.ndarray:
        if how == "mean":
            return np.ones(len(ids), dtype=np.float32)
        # idf over the catalog; a token the catalog lacks counts as rare.
        return np.array(
            [math.log((self.n + 1) / (self.df.get(i, 0) + 0.5)) for i in ids], dtype=np.float32
        )

    def pool(self, ids: Sequence[int], how: str) -> np.ndarray:
        if not ids:
            return np.zeros(self.table.shape[1], dtype=np.float32)
        w = self.weight(ids, how)
        v = (self.table[list(ids)] * w[:, None]).sum(axis=0) / max(float(w.sum()), 1e-6)
        return v.astype(np.float32)


def unit(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=-1, keepdims=True)
    return np.divide(m, norms, out=np.zeros_like(m), where=norms > 0)


def fuse(lex: np.ndarray, sim: np.ndarray, how: str, w: float) -> np.ndarray:
    if how == "linear":  # the shipped fusion: lexical over its best + w * cosine
        top = lex.max()
        return (lex / top if top > 0 else lex) + w * sim
    if how == "z":
        matched = lex > 0
        z = np.zeros_like(lex)
        if matched.sum() > 1:
            mu, sd = lex[matched].mean(), lex[matched].std() or 1.0
            z[matched] = (lex[matched] - mu) / sd
            z[~matched] = (0 - mu) / sd
        zs = (sim - sim.mean()) / (sim.std() or 1.0)
        return z + w * zs
    if how == "minmax":
        top = lex.max()
        lo, hi = sim.min(), sim.max()
        return (lex / top if top > 0 else lex) + w * (sim - lo) / ((hi - lo) or 1.0)
    if how == "rrf":
        k = 60.0
        rl = np.empty(len(lex))
        rl[np.argsort(-lex, kind="stable")] = np.arange(1, len(lex) + 1)
        rs = np.empty(len(sim))
        rs[np.argsort(-sim, kind="stable")] = np.arange(1, len(sim) + 1)
        return 1 / (k + rl) * (lex > 0) + w / (k + rs)
    raise ValueError(how)


def hybrid_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    from lodger.tools.ranking import summary, tool_fields
    from lodger.tools.semantic import _embedding_text

    out: dict[str, Any] = {}
    embedder = load_embedder()
    assert embedder is not None
    shipped = HybridIndex(catalog, embedder=embedder)
    tools = shipped.tools
    base = evaluate(lambda q: [h.name for h in shipped.search(q, limit=10)], dev)
    out["hybrid (shipped)"] = {"dev": base.mean(axis=0), "cv": None}
    lexical = shipped.lexical
    queries = [q["query"] for q in dev]
    n = len(tools)
    lex = np.zeros((len(dev), n), dtype=np.float32)
    for i, q in enumerate(queries):
        for d, s in lexical.scores(q).items():
            lex[i, d] = s
        for d in lexical.exact(q):
            lex[i, d] += 100.0 * max(lex[i].max(), 1.0)

    def short_text(t: Any) -> str:
        name, group, description, _, _ = tool_fields(t)
        return f"{name.replace('_', ' ').replace('-', ' ')} {group}. {summary(description)}"

    full_texts = [_embedding_text(t) for t in tools]
    short_texts = [short_text(t) for t in tools]
    sims: dict[str, np.ndarray] = {}
    for dims in (256, 128, 64):
        vf = Vectors(full_texts, queries, dims)
        vs = Vectors(short_texts, queries, dims)
        for pool in ("mean", "idf"):
            docs_f = np.stack([vf.pool(ids, pool) for ids in vf.doc_ids])
            docs_s = np.stack([vs.pool(ids, pool) for ids in vs.doc_ids])
            qv = np.stack([vf.pool(vf.query_ids[q], pool) for q in queries])
            for centre in ("raw", "centred"):
                df_, ds_, q_ = docs_f, docs_s, qv
                if centre == "centred":  # remove the catalog's common component
                    mu = unit(docs_f).mean(axis=0)
                    df_ = unit(docs_f) - mu
                    ds_ = unit(docs_s) - unit(docs_s).mean(axis=0)
                    q_ = unit(qv) - mu
                sf = unit(q_) @ unit(df_).T
                ss = unit(q_) @ unit(ds_).T
                key = f"d{dims} {pool} {centre}"
                sims[key + " full"] = sf
                sims[key + " short"] = ss
                sims[key + " max"] = np.maximum(sf, ss)
                sims[key + " avg"] = (sf + ss) / 2

    def rows(sim: np.ndarray, how: str, w: float) -> np.ndarray:
        res = []
        for i, q in enumerate(dev):
            fused = fuse(lex[i], sim[i], how, w)
            top = np.argsort(-fused, kind="stable")[:10]
            res.append(per_request([tools[d].name for d in top], q["expected"]))
        return np.array(res)

    grids = {
        "linear": (0.2, 0.3, 0.4, 0.5, 0.7, 1.0),
        "z": (0.2, 0.35, 0.5, 0.7, 1.0),
        "minmax": (0.2, 0.3, 0.5, 0.7),
        "rrf": (0.5, 0.75, 1.0, 1.5),
    }
    # Fusion method and weight fitted by CV over the shipped embedding.
    shipped_key = "d256 mean raw full"
    for how, ws in grids.items():
        cands = {f"{how} w={w}": rows(sims[shipped_key], how, w) for w in ws}
        cv, chosen = cross_validate(cands, repeats)
        out[f"fusion {how} (shipped vectors), CV over w"] = {"cv": cv, "chosen": chosen}
    # Every embedding variant with the linear fusion, weight by CV; then all at once.
    everything: dict[str, np.ndarray] = {}
    for key, sim in sims.items():
        cands = {f"{key} linear w={w}": rows(sim, "linear", w) for w in grids["linear"]}
        for how in ("z",):
            cands.update({f"{key} {how} w={w}": rows(sim, how, w) for w in grids[how]})
        everything.update(cands)
        cv, chosen = cross_validate(cands, repeats)
        out[f"vectors {key}, CV over fusion+w"] = {"cv": cv, "chosen": chosen}
    cv, chosen = cross_validate(everything, repeats)
    out["all vector variants x fusion, CV picks"] = {"cv": cv, "chosen": chosen}
    return out


# ---------------------------------------------------------------- embedding query expansion


def scores_for_terms(index: ToolIndex, query: str, terms: dict[str, float]) -> dict[int, float]:
    """``ToolIndex.scores`` with the query's terms given (same boosts)."""
    from lodger.tools.ranking import action, tokenize

    scores: dict[int, float] = {}
    for term, times in terms.items():
        for doc, c in index._postings.get(term, ()):
            scores[doc] = scores.get(doc, 0.0) + times * c
    w = index.weights
    named = [index._groups[t] for t, times in terms.items() if times >= 1 and t in index._groups]
    if w.group_boost > 0 and named:
        for doc in set().union(*named):
            if doc in scores:
                scores[doc] *= 1 + w.group_boost
    asked = action(tokenize(query)) if w.action_boost > 0 else None
    if asked is not None:
        for doc in scores:
            if index._actions[doc] == asked:
                scores[doc] *= 1 + w.action_boost
    return scores


class WordNeighbours:
    """Each catalog word's vector (the packaged model's table, mean of its pieces); a query
    word's nearest catalog words stand in for a hand-written list of related words."""

    def __init__(self, index: ToolIndex) -> None:
        from lodger.tools.ranking import _CAMEL, _STOP, _WORD, _stem, tool_fields

        embedder = load_embedder()
        assert embedder is not None
        self.model = embedder._model  # type: ignore[attr-defined]
        words: set[str] = set()
        for t in index.tools:
            for text in tool_fields(t):
                for w in _WORD.findall(_CAMEL.sub(r"\1 \2", text).lower()):
                    if w.isalpha() and len(w) >= 3 and w not in _STOP:
                        words.add(w)
        self.words = sorted(words)
        self.stems = [_stem(w) for w in self.words]
        self.vectors = unit(np.asarray(self.model.embed(self.words, norm=False), dtype=np.float32))
        self._stem = _stem
        self._stop = _STOP
        self._re = (_WORD, _CAMEL)

    def expand(self, query: str, n: int, threshold: float) -> dict[str, float]:
        word_re, camel = self._re
        qwords = [
            w
            for w in word_re.findall(camel.sub(r"\1 \2", query).lower())
            if w.isalpha() and w not in self._stop
        ]
        if not qwords:
            return {}
        qv = unit(np.asarray(self.model.embed(qwords, norm=False), dtype=np.float32))
        sims = qv @ self.vectors.T
        own = {self._stem(w) for w in qwords}
        out: dict[str, float] = {}
        for row in sims:
            for j in np.argsort(-row)[: n + 3]:
                s = float(row[j])
                stem = self.stems[j]
                if s < threshold or stem in own:
                    continue
                out[stem] = max(out.get(stem, 0.0), s)
                if len([1 for _ in out]) >= 10**6:
                    break
        return out


def expansion_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Query words expanded to their nearest catalog words (by the packaged model's
    vectors) at ``lam`` times the similarity, in the lexical ranker alone and under the
    shipped linear fusion; neighbours, threshold, weight (and fusion weight) by CV."""
    from lodger.tools.ranking import query_terms
    from lodger.tools.semantic import _embedding_text

    out: dict[str, Any] = {}
    embedder = load_embedder()
    assert embedder is not None
    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        index = ToolIndex(catalog, weights=replace(FITTED, related=related))
        tools = index.tools
        nb = WordNeighbours(index)
        vec = unit(np.asarray(embedder.embed([_embedding_text(t) for t in tools])))
        sim = unit(np.asarray(embedder.embed([q["query"] for q in dev]))) @ vec.T
        grid = [(n, thr) for n in (1, 2, 3, 5) for thr in (0.3, 0.4, 0.5, 0.6)]
        near = {(q["query"], n, thr): nb.expand(q["query"], n, thr) for q in dev for n, thr in grid}

        def rows(
            n: int, thr: float, lam: float, w: float | None, index: ToolIndex = index
        ) -> np.ndarray:
            res = []
            for i, q in enumerate(dev):
                terms = query_terms(q["query"], related=index.weights.related)
                if lam > 0:
                    for t, s in near[(q["query"], n, thr)].items():
                        terms.setdefault(t, lam * s)
                lex = np.zeros(len(tools), dtype=np.float32)
                for d, s in scores_for_terms(index, q["query"], terms).items():
                    lex[d] = s
                for d in index.exact(q["query"]):
                    lex[d] += 100.0 * max(float(lex.max()), 1.0)
                fused = lex if w is None else fuse(lex, sim[i], "linear", w)
                top = np.argsort(-fused, kind="stable")[:10]
                res.append(per_request([tools[d].name for d in top], q["expected"]))
            return np.array(res)

        for label, ws in (("lexical", (None,)), ("hybrid", (0.4, 0.7, 1.0))):
            plain = {f"w={w} off": rows(1, 0.5, 0.0, w) for w in ws}
            cv, chosen = cross_validate(plain, repeats)
            out[f"[{tag}] {label}" + (", CV over w" if label == "hybrid" else "")] = {
                "cv": cv,
                "chosen": chosen if label == "hybrid" else {},
            }
            cands = dict(plain)
            for w in ws:
                for n, thr in grid:
                    for lam in (0.3, 0.5, 0.7):
                        cands[f"w={w} n={n} thr={thr} lam={lam}"] = rows(n, thr, lam, w)
            cv, chosen = cross_validate(cands, repeats)
            out[f"[{tag}] {label} + embedding neighbours of query words, CV"] = {
                "cv": cv,
                "chosen": chosen,
            }
    return out


def rocchio_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Pseudo-relevance feedback in the embedding space: the query vector plus ``a`` times
    the mean vector of the top ``k`` lexical results, then the shipped linear fusion."""
    from lodger.tools.semantic import _embedding_text

    out: dict[str, Any] = {}
    embedder = load_embedder()
    assert embedder is not None
    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        index = ToolIndex(catalog, weights=replace(FITTED, related=related))
        tools = index.tools
        vec = unit(np.asarray(embedder.embed([_embedding_text(t) for t in tools])))
        qv = unit(np.asarray(embedder.embed([q["query"] for q in dev])))
        lexs = []
        for q in dev:
            lex = np.zeros(len(tools), dtype=np.float32)
            for d, s in index.scores(q["query"]).items():
                lex[d] = s
            for d in index.exact(q["query"]):
                lex[d] += 100.0 * max(float(lex.max()), 1.0)
            lexs.append(lex)

        def rows(sim: np.ndarray, w: float, lexs: list[np.ndarray] = lexs) -> np.ndarray:
            res = []
            for i, q in enumerate(dev):
                top = np.argsort(-fuse(lexs[i], sim[i], "linear", w), kind="stable")[:10]
                res.append(per_request([tools[d].name for d in top], q["expected"]))
            return np.array(res)

        ws = (0.2, 0.4, 0.7, 1.0)
        cands = {f"w={w}": rows(qv @ vec.T, w) for w in ws}
        cv, chosen = cross_validate(cands, repeats)
        out[f"[{tag}] hybrid, CV over w"] = {"cv": cv, "chosen": chosen}
        for k in (1, 3, 5):
            for a in (0.25, 0.5, 1.0):
                moved = []
                for i in range(len(dev)):
                    top = [d for d in np.argsort(-lexs[i], kind="stable")[:k] if lexs[i][d] > 0]
                    moved.append(qv[i] + (a * vec[top].mean(axis=0) if top else 0.0))
                sim = unit(np.stack(moved)) @ vec.T
                for w in ws:
                    cands[f"rocchio k={k} a={a} w={w}"] = rows(sim, w)
        cv, chosen = cross_validate(cands, repeats)
        out[f"[{tag}] hybrid + Rocchio feedback on the query vector, CV"] = {
            "cv": cv,
            "chosen": chosen,
        }
    return out


def proxy_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """The same ideas with the hand-written related words off: dev's vocabulary gaps were
    closed by lists written while looking at dev, so with them on, dev cannot show what an
    idea does for words no list has. With them off, dev stands in for unseen wording."""
    from lodger.tools.semantic import _embedding_text

    out: dict[str, Any] = {}
    embedder = load_embedder()
    assert embedder is not None
    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        index = ToolIndex(catalog, weights=replace(FITTED, related=related))
        fwd = Forward(index)
        tools = index.tools
        vec = unit(np.asarray(embedder.embed([_embedding_text(t) for t in tools])))
        queries = [q["query"] for q in dev]
        qv = unit(np.asarray(embedder.embed(queries)))
        sim = qv @ vec.T

        def hybrid_rows(
            score_fn: Callable[[str], dict[int, float]], how: str, w: float
        ) -> np.ndarray:
            res = []
            for i, q in enumerate(dev):
                lex = np.zeros(len(tools), dtype=np.float32)
                for d, s in score_fn(q["query"]).items():
                    lex[d] = s
                for d in index.exact(q["query"]):
                    lex[d] += 100.0 * max(lex.max(), 1.0)
                fused = fuse(lex, sim[i], how, w)
                top = np.argsort(-fused, kind="stable")[:10]
                res.append(per_request([tools[d].name for d in top], q["expected"]))
            return np.array(res)

        base = evaluate(lambda q: ranked(index, fwd.base(q), q), dev)
        out[f"[{tag}] lexical"] = {"dev": base.mean(axis=0), "cv": None}
        cands = {"lam=0": base}
        for k in (3, 5, 10):
            for m in (5, 10, 20):
                for lam in (0.1, 0.2, 0.3, 0.5):
                    cands[f"k={k} m={m} lam={lam}"] = evaluate(
                        lambda q, k=k, m=m, lam=lam: ranked(index, fwd.prf(q, k, m, lam), q), dev
                    )
        cv, chosen = cross_validate(cands, repeats)
        out[f"[{tag}] lexical + PRF, CV"] = {"cv": cv, "chosen": chosen}
        cands = {"beta=0": base}
        for k in (3, 5, 10):
            for beta in (0.1, 0.2, 0.3, 0.5, 1.0):
                cands[f"k={k} beta={beta}"] = evaluate(
                    lambda q, k=k, beta=beta: ranked(index, fwd.group_prior(q, k, beta), q), dev
                )
        cv, chosen = cross_validate(cands, repeats)
        out[f"[{tag}] lexical + group prior, CV"] = {"cv": cv, "chosen": chosen}
        for how, ws in (
            ("linear", (0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.5)),
            ("z", (0.2, 0.35, 0.5, 0.7, 1.0)),
        ):
            cands = {f"{how} w={w}": hybrid_rows(fwd.base, how, w) for w in ws}
            out[f"[{tag}] hybrid {how} w=0.4 (no fit)"] = {
                "dev": hybrid_rows(fwd.base, how, 0.4).mean(axis=0),
                "cv": None,
            }
            cv, chosen = cross_validate(cands, repeats)
            out[f"[{tag}] hybrid {how}, CV over w"] = {"cv": cv, "chosen": chosen}
        cands = {}
        for w in (0.3, 0.4, 0.5, 0.7, 1.0):
            cands[f"w={w} prf off"] = hybrid_rows(fwd.base, "linear", w)
            for k, m, lam in ((5, 10, 0.2), (5, 10, 0.3), (10, 20, 0.2), (3, 10, 0.3)):
                cands[f"w={w} prf k={k} m={m} lam={lam}"] = hybrid_rows(
                    lambda q, k=k, m=m, lam=lam: fwd.prf(q, k, m, lam), "linear", w
                )
        cv, chosen = cross_validate(cands, repeats)
        out[f"[{tag}] hybrid linear + PRF, CV over w and PRF"] = {"cv": cv, "chosen": chosen}
    return out


def softmatch_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Word-level soft matching with the packaged static vectors: each query word's best
    cosine over a tool's words, averaged with the query words' catalog idf (BERTScore-like
    recall over static embeddings), fused like the sentence cosine."""
    from lodger.tools.ranking import _CAMEL, _STOP, _WORD, _stem, summary, tool_fields
    from lodger.tools.semantic import _embedding_text

    out: dict[str, Any] = {}
    embedder = load_embedder()
    assert embedder is not None
    model = embedder._model  # type: ignore[attr-defined]

    def words(text: str) -> list[str]:
        return [
            w
            for w in _WORD.findall(_CAMEL.sub(r"\1 \2", text).lower())
            if w.isalpha() and len(w) >= 2 and w not in _STOP
        ]

    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        index = ToolIndex(catalog, weights=replace(FITTED, related=related))
        tools = index.tools
        n = len(tools)
        vec = unit(np.asarray(embedder.embed([_embedding_text(t) for t in tools])))
        queries = [q["query"] for q in dev]
        sim = unit(np.asarray(embedder.embed(queries))) @ vec.T
        variants: dict[str, list[list[str]]] = {}
        for field in ("short", "full"):
            docs = []
            for t in tools:
                name, group, description, _params, _ = tool_fields(t)
                text = (
                    f"{name} {group} {summary(description)}"
                    if field == "short"
                    else _embedding_text(t)
                )
                docs.append(list(dict.fromkeys(words(text))))
            variants[field] = docs
        lex_all = []
        for q in queries:
            lex = np.zeros(n, dtype=np.float32)
            for d, s in index.scores(q).items():
                lex[d] = s
            for d in index.exact(q):
                lex[d] += 100.0 * max(lex.max(), 1.0)
            lex_all.append(lex)
        soft: dict[str, np.ndarray] = {}
        for field, docs in variants.items():
            vocab = sorted({w for d in docs for w in d})
            at = {w: i for i, w in enumerate(vocab)}
            V = unit(np.asarray(model.embed(vocab, norm=False), dtype=np.float32))
            flat = np.array([at[w] for d in docs for w in d], dtype=np.int64)
            starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
            dfc: dict[str, int] = {}
            for d in docs:
                for st in {_stem(w) for w in d}:
                    dfc[st] = dfc.get(st, 0) + 1
            rows = []
            for q in queries:
                qw = list(dict.fromkeys(words(q)))
                if not qw:
                    rows.append(np.zeros(n, dtype=np.float32))
                    continue
                Q = unit(np.asarray(model.embed(qw, norm=False), dtype=np.float32))
                S = Q @ V.T
                idf = np.array(
                    [math.log((n + 1) / (dfc.get(_stem(w), 0) + 0.5)) for w in qw], dtype=np.float32
                )
                best = np.maximum.reduceat(S[:, flat], starts, axis=1)  # q words x docs
                rows.append((idf[:, None] * best).sum(axis=0) / idf.sum())
            soft[field] = np.stack(rows)

        def rows_for(sem: np.ndarray, how: str, w: float) -> np.ndarray:
            res = []
            for i, q in enumerate(dev):
                fused = fuse(lex_all[i], sem[i], how, w)
                top = np.argsort(-fused, kind="stable")[:10]
                res.append(per_request([tools[d].name for d in top], q["expected"]))
            return np.array(res)

        ws = (0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.5)
        cands = {f"cos w={w}": rows_for(sim, "linear", w) for w in ws}
        cv, chosen = cross_validate(cands, repeats)
        out[f"[{tag}] hybrid cosine (shipped), CV over w"] = {"cv": cv, "chosen": chosen}
        for field in ("short", "full"):
            cands = {f"soft-{field} w={w}": rows_for(soft[field], "linear", w) for w in ws}
            cv, chosen = cross_validate(cands, repeats)
            out[f"[{tag}] hybrid soft-match {field}, CV over w"] = {"cv": cv, "chosen": chosen}
            cands = {}
            for a in (0.5, 1.0):
                comb = a * soft[field] + (1 - a / 2) * sim
                cands.update(
                    {f"soft-{field}+cos a={a} w={w}": rows_for(comb, "linear", w) for w in ws}
                )
            cv, chosen = cross_validate(cands, repeats)
            out[f"[{tag}] hybrid soft-match {field} + cosine, CV over mix and w"] = {
                "cv": cv,
                "chosen": chosen,
            }
            cands = {
                f"z soft-{field} w={w}": rows_for(soft[field], "z", w)
                for w in (0.2, 0.35, 0.5, 0.7, 1.0)
            }
            cv, chosen = cross_validate(cands, repeats)
            out[f"[{tag}] hybrid soft-match {field} z-fusion, CV over w"] = {
                "cv": cv,
                "chosen": chosen,
            }
    return out


class Proximity:
    """Two adjacent query terms found adjacent in a tool's name or first sentence (the
    ordered-bigram part of the sequential dependence model), and coverage (Lucene's coord:
    the share of the query's own terms a tool matches)."""

    def __init__(self, index: ToolIndex) -> None:
        from itertools import pairwise

        from lodger.tools.ranking import summary, tokenize, tool_fields

        self.index = index
        self.bigrams: dict[tuple[str, str], set[int]] = {}
        for doc, t in enumerate(index.tools):
            name, _group, description, _, _ = tool_fields(t)
            for text in (name, summary(description)):
                for pair in pairwise(tokenize(text)):
                    self.bigrams.setdefault(pair, set()).add(doc)
        self.n = len(index.tools)
        self.own_terms: list[set[str]] = [set() for _ in index.tools]
        for term, postings in index._postings.items():
            for doc, _ in postings:
                self.own_terms[doc].add(term)

    def scores(self, query: str, lam: float, coord: float) -> dict[int, float]:
        from itertools import pairwise

        from lodger.tools.ranking import tokenize

        scores = self.index.scores(query)
        if not scores:
            return scores
        words = tokenize(query)
        if lam > 0:
            top = max(scores.values())
            for pair in dict.fromkeys(pairwise(words)):
                docs = self.bigrams.get(pair)
                if docs:
                    idf = math.log(1 + (self.n - len(docs) + 0.5) / (len(docs) + 0.5))
                    for d in docs:
                        scores[d] = scores.get(d, 0.0) + lam * idf / 5 * top / 5
        if coord > 0 and words:
            own = set(words)
            for d in scores:
                share = len(own & self.own_terms[d]) / len(own)
                scores[d] *= share**coord
        return scores


def proximity_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        index = ToolIndex(catalog, weights=replace(FITTED, related=related))
        px = Proximity(index)
        base = evaluate(lambda q: ranked(index, index.scores(q), q), dev)
        out[f"[{tag}] lexical"] = {"dev": base.mean(axis=0), "cv": None}
        for label, grid in (
            ("bigram", [(lam, 0.0) for lam in (0.25, 0.5, 1.0, 2.0)]),
            ("coverage", [(0.0, c) for c in (0.25, 0.5, 1.0, 2.0)]),
        ):
            cands = {"off": base}
            for lam, c in grid:
                cands[f"{label} lam={lam} coord={c}"] = evaluate(
                    lambda q, lam=lam, c=c: ranked(index, px.scores(q, lam, c), q), dev
                )
            cv, chosen = cross_validate(cands, repeats)
            best = max(cands, key=lambda k: objective(cands[k]))
            out[f"[{tag}] + {label}, CV"] = {
                "cv": cv,
                "chosen": chosen,
                "best_on_all_dev": (best, cands[best].mean(axis=0)),
            }
    return out


def reweighted(index: ToolIndex, delta: float) -> ToolIndex:
    """A copy of ``index`` whose (term, tool) contributions are BM25+: ``delta`` times the
    term's (powered) idf added to every match, so a long description no longer buries it."""
    import copy

    out = copy.copy(index)
    n = len(index.tools)
    postings: dict[str, list[tuple[int, float]]] = {}
    for term, docs in index._postings.items():
        df = len(docs)
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5)) ** index.weights.idf_power
        postings[term] = [(doc, c + delta * idf) for doc, c in docs]
    out._postings = postings
    return out


def bm25_variant_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        index = ToolIndex(catalog, weights=replace(FITTED, related=related))
        base = evaluate(lambda q: ranked(index, index.scores(q), q), dev)
        out[f"[{tag}] lexical"] = {"dev": base.mean(axis=0), "cv": None}
        for label, grid in (("BM25+ delta", (0.1, 0.25, 0.5, 1.0)),):
            cands = {"shipped": base}
            for delta in grid:
                idx = reweighted(index, delta)
                cands[f"delta={delta}"] = evaluate(lambda q, i=idx: ranked(i, i.scores(q), q), dev)
            cv, chosen = cross_validate(cands, repeats)
            best = max(cands, key=lambda k: objective(cands[k]))
            out[f"[{tag}] {label}, CV"] = {
                "cv": cv,
                "chosen": chosen,
                "best_on_all_dev": (best, cands[best].mean(axis=0)),
            }
    return out


def light_stem(word: str) -> str:
    """The stemmer before this pass (plurals, -ing, -ed, -e, -ion), for comparison."""
    if len(word) <= 3 or word.isdigit():
        return word
    if word.endswith(("ions", "ion")) and len(word) - 3 - word.endswith("s") >= 5:
        word = word[: word.rindex("ion")]
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


def use_stemmer(stem: Callable[[str], str]) -> None:
    """Swap ``lodger.tools.ranking``'s stemmer (and what it stemmed at import)."""
    from functools import lru_cache

    import lodger.tools.ranking as ranking

    ranking._stem = lru_cache(maxsize=65_536)(stem)  # type: ignore[assignment]
    ranking._EXPANSIONS = ranking._expansions()
    ranking._ACTIONS = {
        ranking._stem(w): a for a, ws in ranking._ACTION_WORDS.items() for w in ws.split()
    }


def stemmer_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """The light stemmer against Snowball English (Porter2); no parameter: whole dev."""
    import lodger.tools.ranking as ranking

    embedder = load_embedder()
    assert embedder is not None
    shipped = ranking._stem
    out: dict[str, Any] = {}
    try:
        for label, stem in (("light stemmer (before)", light_stem), ("Snowball English", None)):
            if stem is None:
                ranking._stem = shipped
                ranking._EXPANSIONS = ranking._expansions()
                ranking._ACTIONS = {
                    shipped(w): a for a, ws in ranking._ACTION_WORDS.items() for w in ws.split()
                }
            else:
                use_stemmer(stem)
            for related in (0.0, FITTED.related):
                tag = "hand lists" if related else "no hand lists"
                weights = replace(FITTED, related=related)
                lexical = ToolIndex(catalog, weights=weights)
                hybrid = HybridIndex(catalog, embedder=embedder, weights=weights)
                for kind, index in (("lexical", lexical), ("hybrid", hybrid)):
                    rows = evaluate(lambda q, i=index: [h.name for h in i.search(q, limit=10)], dev)
                    out[f"[{tag}] {kind}, {label}"] = {"dev": rows.mean(axis=0), "cv": None}
    finally:
        ranking._stem = shipped
        ranking._EXPANSIONS = ranking._expansions()
        ranking._ACTIONS = {
            shipped(w): a for a, ws in ranking._ACTION_WORDS.items() for w in ws.split()
        }
    return out


def idf_power_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """``FieldWeights.idf_power`` by CV, in the lexical ranker and (jointly with the
    fusion weight) in the hybrid one, against CV over the fusion weight alone."""
    embedder = load_embedder()
    assert embedder is not None
    out: dict[str, Any] = {}
    powers = (1.0, 0.5, 0.75, 1.25)
    ws = (0.3, 0.4, 0.5, 0.7)
    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        lexical: dict[str, np.ndarray] = {}
        hybrid: dict[str, np.ndarray] = {}
        for power in powers:
            weights = replace(FITTED, related=related, idf_power=power)
            index = ToolIndex(catalog, weights=weights)
            lexical[f"power={power}"] = evaluate(
                lambda q, i=index: [h.name for h in i.search(q, limit=10)], dev
            )
            for w in ws:
                hy = HybridIndex(catalog, embedder=embedder, weights=weights, semantic_weight=w)
                hybrid[f"power={power} w={w}"] = evaluate(
                    lambda q, i=hy: [h.name for h in i.search(q, limit=10)], dev
                )
        out[f"[{tag}] lexical, idf power 1 (before)"] = {
            "dev": lexical["power=1.0"].mean(axis=0),
            "cv": None,
        }
        cv, chosen = cross_validate(lexical, repeats)
        out[f"[{tag}] lexical, idf power by CV"] = {"cv": cv, "chosen": chosen}
        cv, chosen = cross_validate({k: v for k, v in hybrid.items() if "power=1.0" in k}, repeats)
        out[f"[{tag}] hybrid, idf power 1, fusion weight by CV"] = {"cv": cv, "chosen": chosen}
        cv, chosen = cross_validate(hybrid, repeats)
        out[f"[{tag}] hybrid, idf power and fusion weight by CV"] = {"cv": cv, "chosen": chosen}
    return out


def saturation_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """BM25's k1 and the length normalisation (b) of descriptions and parameters by CV,
    the other weights as shipped."""
    out: dict[str, Any] = {}
    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        shipped = replace(FITTED, related=related)
        cands: dict[str, np.ndarray] = {}
        grid = [(shipped.k1, shipped.description_b, shipped.parameter_b)]
        grid += [
            (k1, db, pb)
            for k1 in (1.2, 1.6, 2.0, 2.5, 3.0)
            for db in (0.5, 0.75, 0.9)
            for pb in (0.5, 0.75, 0.9)
            if (k1, db, pb) != grid[0]
        ]
        for k1, db, pb in grid:
            weights = replace(shipped, k1=k1, description_b=db, parameter_b=pb)
            index = ToolIndex(catalog, weights=weights)
            cands[f"k1={k1} b_desc={db} b_param={pb}"] = evaluate(
                lambda q, i=index: [h.name for h in i.search(q, limit=10)], dev
            )
        first = next(iter(cands))
        out[f"[{tag}] lexical, shipped k1 and b"] = {"dev": cands[first].mean(axis=0), "cv": None}
        cv, chosen = cross_validate(cands, repeats)
        out[f"[{tag}] lexical, k1 and b by CV"] = {"cv": cv, "chosen": chosen}
    return out


class Associations:
    """A thesaurus from the catalog itself (global analysis): a word of the descriptions
    and parameters is associated with the name words of the tools that say it, by
    P(name word | description word) times the name word's idf."""

    def __init__(self, index: ToolIndex) -> None:
        from lodger.tools.ranking import _name_words, schema_words, tokenize

        self.index = index
        n = len(index.tools)
        said: dict[str, set[int]] = {}
        named: dict[str, set[int]] = {}
        for doc, t in enumerate(index.tools):
            for term in set(tokenize(_name_words(t))):
                named.setdefault(term, set()).add(doc)
            words = tokenize(t.description + " " + " ".join(schema_words(t.parameters)))
            for term in set(words):
                said.setdefault(term, set()).add(doc)
        self.said = said
        self.named = named
        self.idf = {t: math.log(1 + (n - len(d) + 0.5) / (len(d) + 0.5)) for t, d in named.items()}
        self.by_doc: dict[int, set[str]] = {}
        for term, docs in named.items():
            for d in docs:
                self.by_doc.setdefault(d, set()).add(term)

    def related(self, term: str, top: int, minimum: float) -> list[tuple[str, float]]:
        docs = self.said.get(term)
        if not docs or len(docs) < 2:
            return []
        counts: dict[str, int] = {}
        for d in docs:
            for n in self.by_doc.get(d, ()):
                counts[n] = counts.get(n, 0) + 1
        scored = [
            (n, c / len(docs) * self.idf[n] / 5) for n, c in counts.items() if n != term and c >= 2
        ]
        scored = [x for x in scored if x[1] >= minimum]
        return heapq.nlargest(top, scored, key=lambda x: x[1])


def association_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    from lodger.tools.ranking import query_terms, tokenize

    out: dict[str, Any] = {}
    for related in (0.0, FITTED.related):
        tag = "hand lists" if related else "no hand lists"
        index = ToolIndex(catalog, weights=replace(FITTED, related=related))
        assoc = Associations(index)
        base = evaluate(lambda q, i=index: [h.name for h in i.search(q, limit=10)], dev)
        cands = {"off": base}
        for top in (1, 3, 5):
            for minimum in (0.05, 0.1, 0.2):
                for lam in (0.2, 0.4, 0.7):

                    def search(
                        q: str, top: int = top, m: float = minimum, lam: float = lam
                    ) -> list[str]:
                        terms = query_terms(q, related=related)
                        for word in set(tokenize(q)):
                            for n, a in assoc.related(word, top, m):
                                if n not in terms:
                                    terms[n] = lam * min(a, 1.0)
                        return ranked(index, scores_for_terms(index, q, terms), q)

                    cands[f"top={top} min={minimum} lam={lam}"] = evaluate(search, dev)
        out[f"[{tag}] lexical"] = {"dev": base.mean(axis=0), "cv": None}
        cv, chosen = cross_validate(cands, repeats)
        out[f"[{tag}] lexical + catalog associations, CV"] = {"cv": cv, "chosen": chosen}
    return out


_QUESTION = frozenset(
    [
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "where",
        "when",
        "how",
        "is",
        "are",
        "was",
        "were",
        "does",
        "do",
        "did",
        "has",
        "have",
        "can",
    ]
)
# The Snowball project's English stop word list, split as our tokenizer splits words.
_SNOWBALL_STOP = frozenset(
    [
        "i",
        "me",
        "my",
        "myself",
        "we",
        "our",
        "ours",
        "ourselves",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "he",
        "him",
        "his",
        "himself",
        "she",
        "her",
        "hers",
        "herself",
        "it",
        "its",
        "itself",
        "they",
        "them",
        "their",
        "theirs",
        "themselves",
        "what",
        "which",
        "who",
        "whom",
        "this",
        "that",
        "these",
        "those",
        "am",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "have",
        "has",
        "had",
        "having",
        "do",
        "does",
        "did",
        "doing",
        "would",
        "should",
        "could",
        "ought",
        "a",
        "an",
        "the",
        "and",
        "but",
        "if",
        "or",
        "because",
        "as",
        "until",
        "while",
        "of",
        "at",
        "by",
        "for",
        "with",
        "about",
        "against",
        "between",
        "into",
        "through",
        "during",
        "before",
        "after",
        "above",
        "below",
        "to",
        "from",
        "up",
        "down",
        "in",
        "out",
        "on",
        "off",
        "over",
        "under",
        "again",
        "further",
        "then",
        "once",
        "here",
        "there",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "both",
        "each",
        "few",
        "more",
        "most",
        "other",
        "some",
        "such",
        "no",
        "nor",
        "not",
        "only",
        "own",
        "same",
        "so",
        "than",
        "too",
        "very",
        "s",
        "t",
        "d",
        "ll",
        "re",
        "ve",
        "m",
    ]
)


def query_side_ideas(catalog: Any, dev: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """No parameter, so on all of dev: (1) a question ("what errors...", "are the checks
    green") with no verb of action asks to read; (2) the Snowball English stop word list in
    place of ours; (3) the query embedded with its related words appended."""
    import re

    import lodger.tools.ranking as ranking
    from lodger.tools.ranking import action, tokenize

    embedder = load_embedder()
    assert embedder is not None
    out: dict[str, Any] = {}
    raw: dict[str, list[str]] = {}
    for word, related_words in (*ranking._RELATED_WORDS.items(), *ranking._GENERAL_WORDS.items()):
        raw.setdefault(ranking._stem(word), []).append(related_words)

    def asked(query: str) -> str | None:
        found = action(tokenize(query))
        first = re.findall(r"[a-z]+", query.lower())[:1]
        return found or ("read" if first and first[0] in _QUESTION else None)

    def question_scores(self: ToolIndex, query: str) -> dict[int, float]:
        from lodger.tools.ranking import query_terms

        terms = query_terms(query, related=self.weights.related)
        scores = scores_for_terms(replace_action(self), query, terms)
        kind = asked(query)
        if kind is not None and self.weights.action_boost > 0:
            for doc in scores:
                if self._actions[doc] == kind:
                    scores[doc] *= 1 + self.weights.action_boost
        return scores

    def replace_action(index: ToolIndex) -> ToolIndex:
        import copy

        plain = copy.copy(index)
        plain.weights = replace(index.weights, action_boost=0.0)
        return plain

    original_scores = ToolIndex.scores
    original_similarities = HybridIndex.similarities
    original_stop = ranking._STOP

    def restop(stop: frozenset[str]) -> None:
        ranking._STOP = stop
        ranking._EXPANSIONS = ranking._expansions()

    def expanded(self: HybridIndex, query: str) -> np.ndarray:
        extra = [w for term in tokenize(query) for w in raw.get(term, [])]
        return original_similarities(self, " ".join([query, *extra]))

    variants: list[tuple[str, Callable[[], None]]] = [
        ("shipped", lambda: None),
        ("question -> read", lambda: setattr(ToolIndex, "scores", question_scores)),
        ("Snowball stop words", lambda: restop(_SNOWBALL_STOP)),
        ("query vector with related words", lambda: setattr(HybridIndex, "similarities", expanded)),
    ]
    try:
        for label, apply in variants:
            apply()
            for related in (0.0, FITTED.related):
                tag = "hand lists" if related else "no hand lists"
                weights = replace(FITTED, related=related)
                for kind, index in (
                    ("lexical", ToolIndex(catalog, weights=weights)),
                    ("hybrid", HybridIndex(catalog, embedder=embedder, weights=weights)),
                ):
                    if label.startswith("query vector") and kind == "lexical":
                        continue
                    rows = evaluate(lambda q, i=index: [h.name for h in i.search(q, limit=10)], dev)
                    out[f"[{tag}] {kind}, {label}"] = {"dev": rows.mean(axis=0), "cv": None}
            ToolIndex.scores = original_scores  # type: ignore[method-assign]
            HybridIndex.similarities = original_similarities  # type: ignore[method-assign]
            restop(original_stop)
    finally:
        ToolIndex.scores = original_scores  # type: ignore[method-assign]
        HybridIndex.similarities = original_similarities  # type: ignore[method-assign]
        restop(original_stop)
    return out


IDEAS: dict[str, Callable[[Any, Sequence[dict[str, Any]], int], dict[str, Any]]] = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--only", choices=tuple(IDEAS), default=None)
    parser.add_argument("--folds", type=int, default=2)
    args = parser.parse_args()
    global FOLDS
    FOLDS = args.folds
    catalog = load_catalog(HELD_OUT / "mcp_catalog_real.json")
    dev = dev_requests()
    results: dict[str, Any] = {}
    for name, ideas in IDEAS.items():
        if args.only in (None, name):
            results.update(ideas(catalog, dev, args.repeats))
    shipped = ToolIndex(catalog)
    baseline = evaluate(lambda q: [h.name for h in shipped.search(q, limit=10)], dev).mean(axis=0)
    print(f"dev half only: {len(dev)} requests; CV = {args.repeats} x {FOLDS}-fold inside dev")
    print(f"{'idea':<58} {'r@1':>6} {'r@5':>6} {'MRR':>6}  how")
    table = {}
    for label, r in results.items():
        m = r["cv"] if r.get("cv") is not None else r["dev"]
        how = "CV" if r.get("cv") is not None else "dev"
        print(f"{label:<58} {m[0]:6.3f} {m[1]:6.3f} {m[2]:6.3f}  {how}")
        if r.get("chosen"):
            top = sorted(r["chosen"].items(), key=lambda x: -x[1])[:3]
            print(f"{'':<8}chosen: " + "; ".join(f"{k} x{v}" for k, v in top))
        if r.get("best_on_all_dev"):
            b, bm = r["best_on_all_dev"]
            print(
                f"{'':<8}best on all dev (flatters): {b}: {bm[0]:.3f} / {bm[1]:.3f} / {bm[2]:.3f}"
            )
        table[label] = {
            "how": how,
            "r1": round(float(m[0]), 4),
            "r5": round(float(m[1]), 4),
            "mrr": round(float(m[2]), 4),
            "r5_ratio_vs_shipped_lexical": round(float(m[1] / baseline[1]), 4),
        }
    print(
        json.dumps(
            {
                "bench": "tool_search_cv",
                "split": "dev",
                "repeats": args.repeats,
                "folds": FOLDS,
                "baseline_shipped_lexical": {
                    k: round(float(v), 4)
                    for k, v in zip(("r1", "r5", "mrr"), baseline, strict=True)
                },
                "python": sys.version.split()[0],
                "ideas": table,
            }
        )
    )


IDEAS.update(
    {
        "stemmer": stemmer_ideas,
        "lexical": lexical_ideas,
        "bm25": bm25_variant_ideas,
        "idf": idf_power_ideas,
        "saturation": saturation_ideas,
        "associations": association_ideas,
        "query": query_side_ideas,
        "proximity": proximity_ideas,
        "proxy": proxy_ideas,
        "expansion": expansion_ideas,
        "softmatch": softmatch_ideas,
        "rocchio": rocchio_ideas,
        "hybrid": hybrid_ideas,
    }
)


if __name__ == "__main__":
    main()
