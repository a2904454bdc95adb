"""An experiment harness, not a lodger feature: a learned re-ranker, and the dev misses by kind.

Like ``bench/tool_search_cv.py`` it reads only the DEV half of
``bench/data/tool_search_requests.json``. Three ideas of the fourth pass:

1. A learned ranker: a linear model over per-candidate features (listed in ``FEATURES``),
   trained pairwise (logistic loss on relevant-minus-irrelevant score differences, L2
   penalty) and applied to the union of the top ``K`` lexical and top ``K`` semantic
   candidates. It is judged by repeated 2-fold cross-validation inside dev: the weights
   are fitted on one fold and the other fold is ranked with them, so every request is
   scored by weights that never saw it; figures are the mean over the repeats.
2. The dev misses of the shipped rankers sorted by kind (``--misses``): wrong server,
   wrong action, no shared word (a vocabulary gap), or other (near misses and labels
   that could be argued).
3. The lexical list fused with two semantic signals (the whole definition, and name +
   first sentence) through the same learned combiner: feature set ``two cosines``.

Each is run with the hand-written related-word lists on and off (``related = 0``), as
``bench/tool_search_cv.py`` explains, for the lexical ranker (no cosine features) and the
hybrid one. The baseline is the shipped ranker of the same kind on the same dev requests,
measured in the same run (it has nothing fitted, so its whole-dev figure is its CV one).

    python bench/tool_search_learned.py [--repeats 10] [--misses]

Printed: a table (dev recall@1 / recall@5 / MRR) and a last line of JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lodger.runtime.config import load_catalog
from lodger.tools.ranking import (
    FITTED,
    ToolIndex,
    action,
    query_terms,
    summary,
    tokenize,
    tool_fields,
)
from lodger.tools.semantic import HybridIndex, _embedding_text, load_embedder

HELD_OUT = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tool_search_cv import cross_validate  # noqa: E402

# The hybrid fusion before this pass: lexical over the best + 0.4 x cosine, no server
# prior. It is the baseline here, and the prior the learned weights are pulled toward.
BEFORE_SEMANTIC_WEIGHT = 0.4
FIELDS = ("name", "group", "description", "parameters", "parameter_text", "summary")
# One row per (request, candidate). What each column says:
FEATURES = (
    "lexical",  # the shipped BM25F score (boosts included) over the best candidate's
    *(f"bm25 {f}" for f in FIELDS),  # BM25 of that field alone, over the best lexical score
    "cosine",  # cosine of the query and the whole definition (the shipped vector)
    "cosine short",  # cosine of the query and name + group + first sentence
    "action",  # 1 when the tool's name verb is the kind of action the request asks
    "server",  # 1 when the request names the tool's server (group)
    "lexical rank",  # 1 / (1 + position in the lexical list)
    "semantic rank",  # 1 / (1 + position in the cosine list)
    "server cosine",  # cosine of the query and the mean vector of the tool's server's tools
    "server bm25",  # BM25 of the query against all of the server's text, over the best server's
)
SETS: dict[str, tuple[str, ...]] = {
    "lexical: fields + boosts": (
        "lexical",
        *(f"bm25 {f}" for f in FIELDS),
        "action",
        "server",
        "lexical rank",
    ),
    "hybrid: lexical score + cosine (linear fusion refit)": ("lexical", "cosine"),
    "hybrid: all features, one cosine": tuple(f for f in FEATURES if f != "cosine short"),
    "hybrid: two cosines + lexical score": ("lexical", "cosine", "cosine short"),
    "hybrid: all features, two cosines": tuple(f for f in FEATURES if not f.startswith("server")),
    "lexical: score + server bm25": ("lexical", "server bm25"),
    "hybrid: lexical + cosine + server cosine": ("lexical", "cosine", "server cosine"),
    "hybrid: lexical + cosine + server bm25": ("lexical", "cosine", "server bm25"),
    "hybrid: lexical + cosine + both server signals": (
        "lexical",
        "cosine",
        "server cosine",
        "server bm25",
    ),
    "hybrid: all features and server signals": FEATURES,
}


def dev_requests() -> list[dict[str, Any]]:
    requests = json.loads((HELD_OUT / "tool_search_requests.json").read_text())
    return [q for q in requests if q["split"] == "dev"]


def metrics(order: Sequence[int], expected: set[int]) -> tuple[float, float, float]:
    for i, doc in enumerate(order[:10]):
        if doc in expected:
            return float(i == 0), float(i < 5), 1 / (i + 1)
    return 0.0, 0.0, 0.0


def unit(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=-1, keepdims=True)
    return np.divide(m, norms, out=np.zeros_like(m), where=norms > 0)


@dataclass
class Query:
    text: str
    expected: set[int]
    candidates: np.ndarray  # tool positions
    x: np.ndarray  # candidates x features
    exact: set[int]
    lexical_order: list[int]  # the shipped lexical ranker's top 10
    hybrid_order: list[int]  # the shipped hybrid ranker's top 10


def build(
    catalog: Any, dev: Sequence[dict[str, Any]], related: float, k: int, lexical_only: bool
) -> list[Query]:
    weights = replace(FITTED, related=related)
    lexical = ToolIndex(catalog, weights=weights)
    tools = lexical.tools
    at = {t.name: i for i, t in enumerate(tools)}
    embedder = load_embedder()
    assert embedder is not None
    hybrid = HybridIndex(
        catalog,
        embedder=embedder,
        weights=weights,
        semantic_weight=BEFORE_SEMANTIC_WEIGHT,
        server_weight=0.0,
    )
    plain = replace(weights, group_boost=0.0, action_boost=0.0)
    per_field = []
    for field in FIELDS:
        zero = {f: 0.0 for f in FIELDS}
        zero[field] = getattr(weights, field) or 1.0
        per_field.append(ToolIndex(catalog, weights=replace(plain, **zero)))
    full = unit(np.asarray(embedder.embed([_embedding_text(t) for t in tools])))

    def short_text(t: Any) -> str:
        name, group, description, _, _ = tool_fields(t)
        return f"{name.replace('_', ' ').replace('-', ' ')} {group}. {summary(description)}"

    short = unit(np.asarray(embedder.embed([short_text(t) for t in tools])))
    kinds = [action(tokenize(tool_fields(t)[0])) for t in tools]
    # Servers as documents: the mean vector of their tools, and all their text as one bag.
    groups = sorted({t.group for t in tools})
    group_of = np.array([groups.index(t.group) for t in tools])
    centroids = unit(np.stack([full[group_of == g].mean(axis=0) for g in range(len(groups))]))
    bags = [Counter() for _ in groups]
    for t, g in zip(tools, group_of, strict=True):
        for text in tool_fields(t):
            bags[g].update(tokenize(text))
    bag_len = np.array([sum(b.values()) for b in bags], dtype=float)
    bag_df = Counter(term for b in bags for term in b)

    def server_bm25(text: str) -> np.ndarray:
        out = np.zeros(len(groups))
        for term, times in query_terms(text, related=related).items():
            n = bag_df.get(term, 0)
            if not n:
                continue
            idf = math.log(1 + (len(groups) - n + 0.5) / (n + 0.5))
            for g, bag in enumerate(bags):
                tf = bag.get(term, 0)
                if tf:
                    norm = 1.2 * (0.25 + 0.75 * bag_len[g] / bag_len.mean())
                    out[g] += times * idf * tf * 2.2 / (tf + norm)
        top = out.max()
        return out / top if top > 0 else out

    group_terms = [set(tokenize(t.group)) for t in tools]
    out = []
    for q in dev:
        text = q["query"]
        lex = np.zeros(len(tools))
        for d, s in lexical.scores(text).items():
            lex[d] = s
        qv = unit(np.asarray(embedder.embed([text])))[0]
        cos, cos_short = full @ qv, short @ qv
        lex_rank = np.argsort(-lex, kind="stable")
        sem_rank = np.argsort(-cos, kind="stable")
        pool = [int(d) for d in lex_rank[:k] if lex[d] > 0]
        if not lexical_only:
            pool += [int(d) for d in sem_rank[:k]]
        exact = set(lexical.exact(text))
        candidates = np.array(sorted(set(pool) | exact), dtype=np.int64)
        if len(candidates) == 0:
            candidates = np.array([0], dtype=np.int64)
        top = max(lex.max(), 1e-9)
        fields = []
        for index in per_field:
            f = np.zeros(len(tools))
            for d, s in index.scores(text).items():
                f[d] = s
            fields.append(f / top)
        position_lex = np.empty(len(tools))
        position_lex[lex_rank] = np.arange(len(tools))
        position_sem = np.empty(len(tools))
        position_sem[sem_rank] = np.arange(len(tools))
        asked = action(tokenize(text))
        terms = set(tokenize(text))
        columns = {
            "lexical": lex / top,
            **{f"bm25 {f}": v for f, v in zip(FIELDS, fields, strict=True)},
            "cosine": cos,
            "cosine short": cos_short,
            "action": np.array([float(asked is not None and k_ == asked) for k_ in kinds]),
            "server": np.array([float(bool(g & terms)) for g in group_terms]),
            "lexical rank": np.where(lex > 0, 1 / (1 + position_lex), 0.0),
            "semantic rank": 1 / (1 + position_sem),
            "server cosine": (centroids @ qv)[group_of],
            "server bm25": server_bm25(text)[group_of],
        }
        x = np.stack([columns[f][candidates] for f in FEATURES], axis=1)
        out.append(
            Query(
                text=text,
                expected={at[n] for n in q["expected"] if n in at},
                candidates=candidates,
                x=x,
                exact=exact,
                lexical_order=[at[h.name] for h in lexical.search(text, limit=10)],
                hybrid_order=[at[h.name] for h in hybrid.search(text, limit=10)],
            )
        )
    return out


def fit(
    queries: Sequence[Query],
    columns: list[int],
    l2: float,
    *,
    loss: str = "pairwise",
    prior: np.ndarray | None = None,
    steps: int = 300,
) -> np.ndarray:
    """A linear scorer's weights, by full-batch gradient descent (Adam) on standardized
    features; the weights returned apply to raw features.

    ``loss``: ``pairwise`` is logistic loss on every (relevant, irrelevant) score difference
    of a request (RankNet with a linear scorer); ``softmax`` is the cross-entropy of the
    relevant tools under a softmax over the request's candidates (ListNet-style: the top
    of the list counts most). Each request weighs the same. The L2 penalty pulls the
    weights toward ``prior`` (raw weights; zero when None): with the shipped ranker as the
    prior, a strong penalty gives back the shipped ranking.
    """
    data = []
    for q in queries:
        pos = np.array([d in q.expected for d in q.candidates])
        if pos.all() or not pos.any():
            continue
        data.append((q.x[:, columns], pos))
    if not data:
        return np.zeros(len(columns)) if prior is None else prior.copy()
    stacked = np.concatenate([x for x, _ in data])
    scale = stacked.std(axis=0)
    scale[scale == 0] = 1.0
    u0 = np.zeros(len(columns)) if prior is None else prior * scale
    u = u0.copy()
    m = np.zeros_like(u)
    v = np.zeros_like(u)
    zs = [(x / scale, pos) for x, pos in data]
    if loss == "softmax":  # padded: requests x candidates x features, and a mask
        width = max(len(z) for z, _ in zs)
        zpad = np.zeros((len(zs), width, len(columns)))
        live = np.zeros((len(zs), width), dtype=bool)
        target = np.zeros((len(zs), width))
        for i, (z, pos) in enumerate(zs):
            zpad[i, : len(z)] = z
            live[i, : len(z)] = True
            target[i, : len(z)] = pos / pos.sum()
    if loss == "pairwise":
        pairs = []
        for z, pos in zs:
            d = (z[pos][:, None, :] - z[~pos][None, :, :]).reshape(-1, len(columns))
            pairs.append((d, np.full(len(d), 1.0 / len(d))))
        diff = np.concatenate([d for d, _ in pairs])
        weight = np.concatenate([w for _, w in pairs]) / len(pairs)
    for t in range(1, steps + 1):
        if loss == "pairwise":
            margin = diff @ u
            g = -(diff * (weight / (1 + np.exp(np.clip(margin, -30, 30))))[:, None]).sum(axis=0)
        else:
            s = np.where(live, zpad @ u, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            g = np.einsum("qc,qcf->f", p - target, zpad) / len(zs)
        g += l2 * (u - u0)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        u -= 0.05 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    raw: np.ndarray = u / scale
    return raw


def rank(q: Query, columns: list[int], w: np.ndarray) -> list[int]:
    s = q.x[:, columns] @ w
    s = s + np.array([1e6 if d in q.exact else 0.0 for d in q.candidates])
    order = np.lexsort((q.candidates, -s))
    return [int(q.candidates[i]) for i in order[:10]]


Config = tuple[str, bool, float]  # loss, shipped ranker as prior, L2
CONFIGS: list[Config] = [
    (loss, prior, l2)
    for loss in ("pairwise", "softmax")
    for prior in (False, True)
    for l2 in (0.01, 0.1, 1.0)
]


# The config the shipped weights were fitted with (its CV figures are printed with the
# others; the nested-CV row is the honest estimate of choosing among them).
PICKED: Config = ("pairwise", True, 0.1)


def split(n: int, seed: int) -> np.ndarray:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    fold = np.empty(n, dtype=int)
    for i, j in enumerate(order):
        fold[j] = i % 2
    return fold


def score(queries: Sequence[Query], columns: list[int], w: np.ndarray) -> np.ndarray:
    return np.array([metrics(rank(q, columns, w), q.expected) for q in queries])


def train(
    queries: Sequence[Query], columns: list[int], config: Config, shipped: np.ndarray
) -> np.ndarray:
    loss, prior, l2 = config
    return fit(queries, columns, l2, loss=loss, prior=shipped if prior else None)


def nested(
    queries: Sequence[Query], columns: list[int], shipped: np.ndarray, seed: int
) -> tuple[np.ndarray, Config]:
    """Weights fitted on ``queries`` with the config that an inner 2-fold CV on them
    (two repeats) scores best by recall@5 + MRR/2; the shipped ranker is a candidate."""
    best: tuple[float, int] = (-1.0, -1)
    for c, config in enumerate([None, *CONFIGS]):
        rows = []
        for r in range(2):
            fold = split(len(queries), seed * 100 + r)
            for f in (0, 1):
                inside = [q for i, q in enumerate(queries) if fold[i] != f]
                held = [q for i, q in enumerate(queries) if fold[i] == f]
                w = shipped if config is None else train(inside, columns, config, shipped)
                rows.append(score(held, columns, w))
        m = np.concatenate(rows).mean(axis=0)
        value = m[1] + 0.5 * m[2]
        if value > best[0] + 1e-12:
            best = (value, c)
    config = [None, *CONFIGS][best[1]]
    if config is None:
        return shipped, ("shipped", True, 0.0)
    return train(queries, columns, config, shipped), config


def cross_validated(
    queries: Sequence[Query],
    columns: list[int],
    config: Config | None,
    shipped: np.ndarray,
    repeats: int,
) -> tuple[np.ndarray, dict[str, int]]:
    """Mean metrics over ``repeats`` 2-fold splits: weights fitted on one half (with
    ``config``, or None: the config chosen by a nested CV inside that half) rank the other."""
    results = []
    chosen: dict[str, int] = {}
    for r in range(repeats):
        fold = split(len(queries), 1000 + r)
        rows = np.zeros((len(queries), 3))
        for f in (0, 1):
            inside = [q for i, q in enumerate(queries) if fold[i] != f]
            if config is None:
                w, picked = nested(inside, columns, shipped, 1000 + r * 2 + f)
                key = " ".join(map(str, picked))
                chosen[key] = chosen.get(key, 0) + 1
            else:
                w = train(inside, columns, config, shipped)
            for i, q in enumerate(queries):
                if fold[i] == f:
                    rows[i] = metrics(rank(q, columns, w), q.expected)
        results.append(rows.mean(axis=0))
    return np.mean(results, axis=0), chosen


def baseline(queries: Sequence[Query], kind: str) -> np.ndarray:
    return np.mean(
        [
            metrics(q.lexical_order if kind == "lexical" else q.hybrid_order, q.expected)
            for q in queries
        ],
        axis=0,
    )


def misses(catalog: Any, dev: Sequence[dict[str, Any]], related: float) -> dict[str, Any]:
    """The dev requests the shipped rankers miss at 5, by kind."""
    weights = replace(FITTED, related=related)
    lexical = ToolIndex(catalog, weights=weights)
    embedder = load_embedder()
    assert embedder is not None
    hybrid = HybridIndex(
        catalog,
        embedder=embedder,
        weights=weights,
        semantic_weight=BEFORE_SEMANTIC_WEIGHT,
        server_weight=0.0,
    )
    report: dict[str, Any] = {}
    for label, index in (("lexical", lexical), ("hybrid", hybrid)):
        kinds: dict[str, list[str]] = {}
        for q in dev:
            hits = index.search(q["query"], limit=5)
            names = [h.name for h in hits]
            if any(n in q["expected"] for n in names):
                continue
            expected = [lexical.get(n) for n in q["expected"]]
            groups = {t.group for t in expected if t is not None}
            scores = lexical.scores(q["query"])
            got = [lexical.doc(n) for n in q["expected"] if lexical.get(n) is not None]
            asked = action(tokenize(q["query"]))
            if not any(scores.get(d, 0) > 0 for d in got):
                kind = "no shared word (vocabulary gap)"
            elif hits and hits[0].tool.group not in groups:
                kind = "wrong server (top result of another)"
            elif hits and action(tokenize(tool_fields(hits[0].tool)[0])) != next(
                (action(tokenize(tool_fields(t)[0])) for t in expected if t is not None), None
            ):
                kind = "right server, wrong action"
            else:
                kind = "right server and action, other tool (near miss or ambiguous label)"
            kinds.setdefault(kind, []).append(
                f"{q['query']!r} -> want {q['expected']}, got {names[:3]} (asked {asked})"
            )
        report[label] = kinds
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--k", type=int, default=30, help="candidates from each list")
    parser.add_argument("--misses", action="store_true", help="print dev misses by kind")
    parser.add_argument("--weights", action="store_true", help="print weights fitted on all dev")
    parser.add_argument("--only", default=None, help="feature sets whose name has this")
    args = parser.parse_args()
    catalog = load_catalog(HELD_OUT / "mcp_catalog_real.json")
    dev = dev_requests()
    if args.misses:
        # The lexical ranker's "no shared word" counts requests where no right tool has a
        # lexical score at all: only a related word or the embedding can reach it.
        for related in (FITTED.related, 0.0):
            tag = "hand lists" if related else "no hand lists"
            for label, kinds in misses(catalog, dev, related).items():
                total = sum(len(v) for v in kinds.values())
                print(f"[{tag}] {label}: {total} dev misses at 5")
                for kind, items in sorted(kinds.items(), key=lambda x: -len(x[1])):
                    print(f"  {len(items):3d}  {kind}")
                    for item in items:
                        print(f"         {item}")
    table: dict[str, Any] = {}
    print(f"dev half only: {len(dev)} requests; CV = {args.repeats} x 2-fold inside dev")
    print(f"{'idea':<100} {'r@1':>6} {'r@5':>6} {'MRR':>6}")
    for related in (FITTED.related, 0.0):
        tag = "hand lists" if related else "no hand lists"
        for kind in ("lexical", "hybrid"):
            queries = build(catalog, dev, related, args.k, lexical_only=kind == "lexical")
            reach = np.mean([bool(q.expected & set(q.candidates.tolist())) for q in queries])
            base = baseline(queries, kind)
            key = f"[{tag}] {kind} " + (
                "(shipped)" if kind == "lexical" else "(before: 0.4 x cosine)"
            )
            table[key] = base
            print(f"{key:<100} {base[0]:6.3f} {base[1]:6.3f} {base[2]:6.3f}  dev")
            print(f"{'':<8}candidates hold a right tool for {reach:.3f} of requests")
            if kind == "hybrid":
                # The shipped fusion (learned on all of dev with the lists: flatters there).
                embedder = load_embedder()
                assert embedder is not None
                now = HybridIndex(
                    catalog, embedder=embedder, weights=replace(FITTED, related=related)
                )
                at = {t.name: i for i, t in enumerate(now.tools)}
                rows = [
                    metrics([at[h.name] for h in now.search(q.text, limit=10)], q.expected)
                    for q in queries
                ]
                m = np.mean(rows, axis=0)
                key = f"[{tag}] hybrid (shipped now: fitted on all dev)"
                table[key] = m
                print(f"{key:<100} {m[0]:6.3f} {m[1]:6.3f} {m[2]:6.3f}  dev")
            for name, features in SETS.items():
                if not name.startswith(kind) or (args.only and args.only not in name):
                    continue
                columns = [FEATURES.index(f) for f in features]
                # The shipped ranker as weights: lexical over the best, plus 0.4 x cosine.
                shipped = np.array(
                    [
                        {"lexical": 1.0, "cosine": BEFORE_SEMANTIC_WEIGHT}.get(f, 0.0)
                        for f in features
                    ]
                )
                alone = score(queries, columns, shipped).mean(axis=0)
                print(
                    f"{'':<8}{name}: shipped weights on these candidates "
                    f"{alone[0]:.3f} / {alone[1]:.3f} / {alone[2]:.3f}"
                )
                for config in [*CONFIGS, None]:
                    cv, chosen = cross_validated(queries, columns, config, shipped, args.repeats)
                    label = "config by nested CV" if config is None else " ".join(map(str, config))
                    key = f"[{tag}] {name}, {label}"
                    table[key] = cv
                    print(f"{key:<100} {cv[0]:6.3f} {cv[1]:6.3f} {cv[2]:6.3f}  CV")
                    if chosen:
                        top = sorted(chosen.items(), key=lambda x: -x[1])[:4]
                        print(f"{'':<8}chosen: " + "; ".join(f"{k} x{v}" for k, v in top))
                    if config == PICKED and name == "hybrid: lexical + cosine + server bm25":
                        # How the shipped weights were made: this config on all of dev (with
                        # the lists), scaled so that the lexical weight is 1.
                        w = train(queries, columns, config, shipped)
                        print(
                            f"{'':<8}fitted on all dev, lexical weight 1: "
                            + ", ".join(
                                f"{f} {v / w[0]:.3f}" for f, v in zip(features, w, strict=True)
                            )
                        )
                    if config is None and args.weights:
                        w, picked = nested(queries, columns, shipped, 7)
                        print(
                            f"{'':<8}on all dev ({' '.join(map(str, picked))}): "
                            + ", ".join(f"{f} {v:+.3f}" for f, v in zip(features, w, strict=True))
                        )
            # A server prior without learning: the shipped score plus beta times one
            # server signal, beta chosen by CV (tool_search_cv's machinery; 0 is a candidate).
            base_features = ("lexical",) if kind == "lexical" else ("lexical", "cosine")
            for signal in ("server bm25", "server cosine"):
                if kind == "lexical" and signal == "server cosine":
                    continue
                features = (*base_features, signal)
                columns = [FEATURES.index(f) for f in features]
                # The fusion before this pass (lexical 1, cosine 0.4), the signal at 0.
                w0 = np.append(np.array([1.0, BEFORE_SEMANTIC_WEIGHT])[: len(base_features)], 0.0)
                cands = {"beta=0": score(queries, columns, w0)}
                for beta in (0.05, 0.1, 0.2, 0.3, 0.5, 0.8):
                    w = w0.copy()
                    w[-1] = beta
                    cands[f"beta={beta}"] = score(queries, columns, w)
                cv, chosen = cross_validate(cands, args.repeats)
                key = f"[{tag}] {kind} + beta x {signal}, beta by CV"
                table[key] = cv
                print(f"{key:<100} {cv[0]:6.3f} {cv[1]:6.3f} {cv[2]:6.3f}  CV")
                top = sorted(chosen.items(), key=lambda x: -x[1])[:4]
                print(f"{'':<8}chosen: " + "; ".join(f"{k} x{v}" for k, v in top))
    print(
        json.dumps(
            {
                "bench": "tool_search_learned",
                "split": "dev",
                "repeats": args.repeats,
                "k": args.k,
                "python": sys.version.split()[0],
                "ideas": {
                    k: {"r1": round(v[0], 4), "r5": round(v[1], 4), "mrr": round(v[2], 4)}
                    for k, v in table.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
