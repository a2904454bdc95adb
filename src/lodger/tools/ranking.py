"""Ranking tools for a query: BM25F over everything a tool definition says.

    >>> index = ToolIndex(registry.deferred())
    >>> [hit.name for hit in index.search("take a screenshot of the page", limit=2)]
    ['playwright__browser_take_screenshot', 'puppeteer__puppeteer_screenshot']

Each tool is six fields: its name (without the ``<group>__`` prefix, weighed most), its
group, its description, the description's first sentence again (what the tool does,
before usage notes), its parameter names, and its parameter descriptions and enum values,
tokenized with camelCase, snake_case and kebab-case split, common English function words
dropped, and stemmed by Snowball's English (Porter2) stemmer. A query word also
searches for the words definitions use for it (``land`` -> ``merge``), and a query that
names a group ("in linear") raises that group's tools. BM25F combines the
length-normalized, weighted term counts of the fields before saturating them, and every
(term, tool) contribution is computed when the index is built, so a query costs only the
postings of its own terms: a fraction of a millisecond over 10,000 tools
(``bench/tool_search.py``). A query that names a tool exactly puts it first.

Why our own: ``rank-bm25`` scores every document in Python (2.2 ms p50 over 10,000
tools, over the 2 ms target), and ``bm25s`` is as fast as this index and ranks the
labeled queries the same (within one query) but brings numpy and scipy into the
runtime's dependencies, and neither weighs fields.
"""

from __future__ import annotations

import heapq
import math
import re
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

from lodger.tools.spec import Tool

__all__ = [
    "CURRENT",
    "FITTED",
    "FieldWeights",
    "SearchHit",
    "ServerIndex",
    "ToolIndex",
    "action",
    "query_terms",
    "schema_words",
    "summary",
    "tokenize",
    "tool_fields",
]

# ---------------------------------------------------------------- text

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD = re.compile(r"[a-z0-9]+")
# fmt: off
_STOP = frozenset((
    "a", "about", "all", "am", "an", "and", "any", "are", "as", "at", "be", "been", "but",
    "by", "can", "could", "did", "do", "does", "for", "from", "get", "had", "has", "have",
    "how", "i", "if", "in", "into", "is", "it", "its", "just", "let", "me", "my", "of", "on",
    "or", "our", "out", "please", "right", "should", "so", "some", "that", "the", "their",
    "them", "then", "there", "these", "this", "those", "to", "us", "use", "using", "want",
    "was", "we", "were", "what", "when", "which", "who", "will", "with", "would", "you",
    "your",
))
# fmt: on


_SNOWBALL = threading.local()  # a Snowball stemmer keeps state while it works: one per thread


@lru_cache(maxsize=65_536)
def _stem(word: str) -> str:
    """The Snowball English (Porter2) stem of ``word`` (``running`` -> ``run``,
    ``deletions``/``delete`` -> ``delet``); short words and numbers as they are."""
    if len(word) <= 3 or word.isdigit():
        return word
    stemmer = getattr(_SNOWBALL, "english", None)
    if stemmer is None:
        import snowballstemmer

        stemmer = _SNOWBALL.english = snowballstemmer.stemmer("english")
    stem: str = stemmer.stemWord(word)
    return stem


def tokenize(text: str) -> list[str]:
    """Lowercased, stemmed words; camelCase, snake_case and kebab-case split apart."""
    words = _WORD.findall(_CAMEL.sub(r"\1 \2", text).lower())
    return [_stem(w) for w in words if w not in _STOP]


# What users say, and the words tool definitions use for it: developer and operations
# vocabulary, written once (not learned from any labelled request). A query term also
# searches for its related words, at ``RELATED_WEIGHT`` of its own weight.
# fmt: off
_RELATED_WORDS: dict[str, str] = {
    "pr": "pull request", "prs": "pull request", "mr": "merge request",
    "ticket": "issue", "tickets": "issue", "bug": "issue", "task": "issue",
    "sprint": "cycle", "iteration": "cycle", "epic": "project parent",
    "land": "merge", "ship": "deploy release", "rollback": "roll back revert",
    "revert": "roll back", "undo": "revert",
    "repo": "repository", "repos": "repository", "codebase": "repository code",
    "doc": "document documentation knowledge", "docs": "document documentation knowledge",
    "spec": "document",
    "wiki": "page document", "note": "comment engagement note",
    "reply": "comment", "respond": "comment reply", "say": "comment",
    "give": "assign", "hand": "assign", "owner": "assignee assign",
    "everyone": "users members", "people": "users members", "teammate": "user member",
    "colleague": "user member", "member": "user", "members": "users",
    "crm": "hubspot contact company deal object", "lead": "contact", "leads": "contacts",
    "deal": "object", "contact": "object", "company": "object",
    "chargeback": "dispute", "chargebacks": "dispute", "charge": "payment",
    "bill": "invoice", "discount": "coupon", "checkout": "payment link",
    "plan": "price subscription", "money": "balance",
    "flag": "feature flag", "toggle": "feature flag", "rollout": "flag targeting",
    "crash": "error exception", "exception": "error", "errors": "error issue",
    "crashlooping": "describe logs pod", "slow": "performance latency trace",
    "latency": "metric", "alert": "monitor", "alerting": "monitor",
    "silence": "mute downtime", "maintenance": "downtime",
    "grep": "search code", "find": "search", "lookup": "get search", "look": "get search",
    "show": "get list", "see": "get list", "check": "status get",
    "delete": "remove", "remove": "delete", "drop": "delete remove",
    "make": "create", "add": "create", "new": "create", "open": "create navigate",
    "start": "create run", "kick": "trigger run", "trigger": "run",
    "retry": "rerun", "restart": "rollout restart", "rename": "update title name",
    "edit": "update", "change": "update", "set": "update", "modify": "update",
    "close": "state closed complete", "finish": "complete", "reopen": "state open",
    "upvote": "reaction", "thumbs": "reaction", "emoji": "reaction",
    "tab": "page", "tabs": "pages", "website": "page site url", "site": "page url",
    "url": "page navigate", "console": "message log", "javascript": "script evaluate",
    "js": "javascript script", "popup": "dialog", "confirm": "dialog accept",
    "dropdown": "select option", "field": "input property schema",
    "fields": "input property schema", "viewport": "resize",
    "screen": "screenshot", "video": "screencast", "memory": "heap",
    "inbox": "notification", "unread": "notification",
    "database": "db", "db": "database", "table": "schema", "column": "schema",
    "sql": "query", "vector": "index", "vectors": "record",
    "cluster": "kubernetes", "pod": "kubernetes", "container": "pod",
    "vulnerability": "alert advisory dependabot", "vulnerable": "dependabot alert",
    "cve": "advisory", "secret": "scanning", "leaked": "secret scanning",
    "audit": "log audit", "history": "log history",
    "credentials": "secret token", "password": "secret",
    "ask": "request", "asked": "request", "read": "get content", "readme": "file content",
    "mention": "search", "mentions": "search", "access": "permission collaborator",
    "notify": "webhook notification", "where": "filter query", "associate": "association",
    "record": "create", "exist": "list", "available": "list",
}
# Verbs and nouns of software operations and the words APIs name them with, written from
# general knowledge (not from the labelled requests); merged with the ones above.
_GENERAL_WORDS: dict[str, str] = {
    "fetch": "get", "retrieve": "get", "obtain": "get", "display": "get list",
    "view": "get list", "enumerate": "list", "browse": "list navigate",
    "erase": "delete", "destroy": "delete", "purge": "delete", "wipe": "delete clear",
    "discard": "delete", "trash": "delete", "generate": "create", "produce": "create",
    "provision": "create", "spawn": "create", "draft": "create", "compose": "create write",
    "write": "create", "post": "create send", "publish": "create release",
    "alter": "update", "adjust": "update", "tweak": "update", "patch": "update",
    "fix": "update", "replace": "update", "save": "create update write",
    "locate": "search find", "query": "search", "lookup": "search", "filter": "search",
    "upload": "create upload", "download": "get export", "export": "download",
    "send": "create message", "message": "send", "email": "send message",
    "invite": "add member", "kick": "remove member", "revoke": "remove delete",
    "disable": "update off", "enable": "update on", "activate": "enable",
    "stop": "cancel", "halt": "stop cancel", "abort": "cancel", "kill": "stop cancel",
    "pause": "stop", "resume": "start", "duplicate": "copy clone", "clone": "copy fork",
    "copy": "fork duplicate", "move": "transfer update", "transfer": "move",
    "tag": "label", "tags": "labels", "label": "tag", "categorize": "label",
    "approve": "review approve", "reject": "review decline", "decline": "reject",
    "count": "count stats total", "many": "count stats", "total": "count stats",
    "overview": "summary stats", "statistics": "stats", "metrics": "metric stats",
    "logs": "log", "trace": "span", "dashboard": "dashboard metric",
    "customer": "customer user", "client": "customer", "user": "member account",
    "account": "user", "employee": "member user", "staff": "member user",
    "chat": "message channel", "channel": "message", "dm": "message direct",
    "capture": "screenshot snapshot", "snapshot": "screenshot", "click": "click press",
    "press": "click key", "tap": "click", "hover": "mouse", "scroll": "mouse wheel",
    "enter": "type fill", "fill": "type input", "type": "fill input",
    "go": "navigate", "visit": "navigate", "load": "navigate open",
    "deploy": "release deployment", "release": "deploy", "build": "pipeline job",
    "ci": "pipeline workflow", "job": "pipeline workflow", "pipeline": "workflow",
    "schedule": "cron", "recurring": "schedule",
    "due": "date", "deadline": "due date", "today": "date", "week": "date",
    "assigned": "assignee", "mine": "assignee me",
    "star": "starred", "fork": "copy", "branch": "ref", "commit": "commits",
}
# What a request asks done, by the verb that says it: a tool whose name starts with a
# verb of the same kind (``create_issue`` for "open a bug report") is raised.
_ACTION_WORDS: dict[str, str] = {
    "create": "create add new make open insert post write draft generate file submit",
    "read": "get read fetch show view describe retrieve detail inspect list search find "
    "query browse lookup look",
    "update": "update edit change set modify rename patch move assign",
    "delete": "delete remove drop erase destroy clear purge",
    "run": "run execute trigger start kick launch",
}
# fmt: on
RELATED_WEIGHT = 0.7
EXACT_BONUS = 100.0  # a tool named exactly in the query ranks first


def _expansions() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for word, related in (*_RELATED_WORDS.items(), *_GENERAL_WORDS.items()):
        key = _stem(word)
        out[key] = tuple(dict.fromkeys(out.get(key, ()) + tuple(tokenize(related))))
    return out


_EXPANSIONS = _expansions()
_ACTIONS = {
    _stem(word): action for action, words in _ACTION_WORDS.items() for word in words.split()
}


def action(words: Iterable[str]) -> str | None:
    """The kind of action of the first verb among tokenized ``words`` (None: no verb)."""
    return next((_ACTIONS[w] for w in words if w in _ACTIONS), None)


def query_terms(query: str, *, related: float = RELATED_WEIGHT) -> dict[str, float]:
    """The terms of ``query`` with their weights: its own words at 1 each, and the words
    related to them (``PR`` -> ``pull``, ``request``) at ``related`` unless said outright."""
    own = Counter(tokenize(query))
    terms: dict[str, float] = {term: float(n) for term, n in own.items()}
    if related > 0:
        for term in own:
            for extra in _EXPANSIONS.get(term, ()):
                if extra not in own:
                    terms[extra] = max(terms.get(extra, 0.0), related)
        # Two words said apart that definitions write as one: "roll back" -> rollback,
        # "log in" -> login, "set up" -> setup.
        words = _WORD.findall(_CAMEL.sub(r"\1 \2", query).lower())
        for first, second in pairwise(words):
            if first.isalpha() and second.isalpha():
                joined = _stem(first + second)
                if joined not in own:
                    terms[joined] = max(terms.get(joined, 0.0), related)
    return terms


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


@dataclass(frozen=True, kw_only=True)
class FieldWeights:
    """How much each part of a definition counts, and how its length normalizes it.

    ``CURRENT`` reads only name, group and description (the ranker before parameters
    were read); ``FITTED`` (the default) also reads parameter names, their descriptions
    and enum values, the first sentence again, and boosts a group the query names, with
    weights fitted on the dev half of ``bench/data`` (a random local search over these
    numbers, scored by recall@5 plus half the MRR of the dev requests). ``idf_power``
    was chosen by cross-validation inside the dev half (``bench/tool_search_cv.py``):
    at 0.75, a term shared by many tools ("issue", "list") is not drowned by a rare one.
    """

    name: float
    group: float
    description: float
    parameters: float = 0.0  # parameter names
    parameter_text: float = 0.0  # parameter descriptions and enum values
    name_b: float = 0.3
    description_b: float = 0.75
    parameter_b: float = 0.75
    summary: float = 0.0  # the description's first sentence, counted again
    k1: float = 1.2
    related: float = RELATED_WEIGHT  # weight of a query word's related words (0: none)
    group_boost: float = 0.0  # scores of a group the query names are raised by this part
    action_boost: float = 0.0  # and of a tool whose name's verb is the request's kind
    idf_power: float = 1.0  # a term's idf counts to this power (below 1: rare terms count less)

    def fields(self) -> tuple[_Field, ...]:
        return (
            _Field(self.name, self.name_b),
            _Field(self.group, 0.0),
            _Field(self.description, self.description_b),
            _Field(self.parameters, self.parameter_b),
            _Field(self.parameter_text, self.parameter_b),
            _Field(self.summary, self.description_b),
        )


CURRENT = FieldWeights(name=3.0, group=1.5, description=1.0, related=0.0)
FITTED = FieldWeights(
    name=4.0,
    group=3.0,
    description=1.0,
    parameters=1.0,
    parameter_text=0.7,
    summary=2.0,
    name_b=0.0,
    k1=2.0,
    group_boost=1.0,
    action_boost=0.1,
    idf_power=0.75,
)


def _name_words(t: Tool) -> str:
    # ``git__git_log`` is ``git_log`` of group ``git``: the prefix is the group's business.
    prefix = f"{t.group}__"
    return t.name[len(prefix) :] if t.name.startswith(prefix) else t.name


_MAX_SCHEMA_NODES = 2_000  # a huge schema is read only so far: enough to rank by


def schema_words(schema: object) -> tuple[str, str]:
    """A schema's parameter names, and its parameter descriptions and enum values, as text.

    Walks nested objects, arrays and ``anyOf``/``oneOf`` branches; ``merge_method`` with
    ``enum: [merge, squash, rebase]`` gives ``"merge_method"`` and ``"... merge squash
    rebase"``, so a request to squash finds the tool that can.
    """
    names: list[str] = []
    text: list[str] = []
    stack: list[object] = [schema]
    seen = 0
    while stack and seen < _MAX_SCHEMA_NODES:
        node = stack.pop()
        seen += 1
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        properties = node.get("properties")
        if isinstance(properties, dict):
            for key, sub in properties.items():
                names.append(str(key))
                stack.append(sub)
        description = node.get("description")
        if isinstance(description, str) and node is not schema:
            text.append(description)
        enum = node.get("enum")
        if isinstance(enum, list):
            text.extend(str(v) for v in enum if isinstance(v, str | int | float))
        for keyword in ("items", "anyOf", "oneOf", "allOf", "additionalProperties"):
            sub = node.get(keyword)
            if isinstance(sub, dict | list):
                stack.append(sub)
    return " ".join(names), " ".join(text)


_SENTENCE_END = re.compile(r"(?<=[a-z0-9)])[.!?](?:\s|$)|\n\s*\n")


def summary(description: str) -> str:
    """The first sentence of ``description``: what the tool does, before usage notes."""
    found = _SENTENCE_END.search(description)
    return (description if found is None else description[: found.start()])[:300]


def tool_fields(t: Tool) -> tuple[str, str, str, str, str]:
    """The five texts a tool is ranked by: name words, group, description, parameter
    names, parameter descriptions and enum values."""
    parameters, parameter_text = schema_words(t.parameters)
    return _name_words(t), t.group, t.description, parameters, parameter_text


class ToolIndex:
    """BM25F over name, group and description, as an inverted index of precomputed
    per-(term, tool) contributions. Ties break by name, so rankings are deterministic."""

    def __init__(self, tools: Iterable[Tool], *, weights: FieldWeights = FITTED) -> None:
        self.tools = sorted(tools, key=lambda t: t.name)
        self.weights = weights
        self._doc = {t.name: doc for doc, t in enumerate(self.tools)}
        fields = weights.fields()
        docs = [
            [
                (field, Counter(tokenize(text)))
                for field, text in zip(
                    fields, (*tool_fields(t), summary(t.description)), strict=True
                )
                if field.weight > 0
            ]
            for t in self.tools
        ]
        n = max(len(docs), 1)
        totals: dict[int, float] = {}
        for d in docs:
            for i, (_, counts) in enumerate(d):
                totals[i] = totals.get(i, 0.0) + sum(counts.values())
        average = {i: max(total / n, 1.0) for i, total in totals.items()}
        pseudo: list[dict[str, float]] = []
        df: Counter[str] = Counter()
        for d in docs:
            weighted: dict[str, float] = {}
            for i, (field, counts) in enumerate(d):
                norm = 1 - field.b + field.b * sum(counts.values()) / average[i]
                for term, tf in counts.items():
                    weighted[term] = weighted.get(term, 0.0) + field.weight * tf / norm
            pseudo.append(weighted)
            df.update(weighted.keys())
        k1 = weights.k1
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for doc, weighted in enumerate(pseudo):
            for term, weight in weighted.items():
                idf = math.log(1 + (len(docs) - df[term] + 0.5) / (df[term] + 0.5))
                idf **= weights.idf_power
                self._postings.setdefault(term, []).append((doc, idf * weight / (k1 + weight)))
        # The kind of action each tool's name says (its first verb), for the action boost.
        self._actions = [action(tokenize(_name_words(t))) for t in self.tools]
        # The tools of each word of a group's name, for the group boost.
        self._groups: dict[str, list[int]] = {}
        for doc, t in enumerate(self.tools):
            for term in dict.fromkeys(tokenize(t.group)):
                self._groups.setdefault(term, []).append(doc)

    def __len__(self) -> int:
        return len(self.tools)

    def doc(self, name: str) -> int:
        """The position of the tool named ``name`` in ``tools``."""
        return self._doc[name]

    def get(self, name: str) -> Tool | None:
        doc = self._doc.get(name)
        return None if doc is None else self.tools[doc]

    def scores(self, query: str) -> dict[int, float]:
        """BM25F scores of the tools sharing a term with ``query``, by position in ``tools``."""
        scores: dict[int, float] = {}
        terms = query_terms(query, related=self.weights.related)
        for term, times in terms.items():
            for doc, contribution in self._postings.get(term, ()):
                scores[doc] = scores.get(doc, 0.0) + times * contribution
        named = [self._groups[t] for t, times in terms.items() if times >= 1 and t in self._groups]
        if self.weights.group_boost > 0 and named:
            # A request that names a server ("in linear", "the notion workspace") wants
            # that server's tools: their scores are raised by ``group_boost`` of themselves.
            boost = 1 + self.weights.group_boost
            for doc in set().union(*named):
                if doc in scores:
                    scores[doc] *= boost
        asked = action(tokenize(query)) if self.weights.action_boost > 0 else None
        if asked is not None:
            boost = 1 + self.weights.action_boost
            for doc in scores:
                if self._actions[doc] == asked:
                    scores[doc] *= boost
        return scores

    def exact(self, query: str) -> list[int]:
        """The tools ``query`` names exactly (``git__git_log``), which it wants first."""
        found = (self._doc.get(word.strip(" ,.;:'\"`")) for word in query.split())
        return list(dict.fromkeys(doc for doc in found if doc is not None))

    def search(self, query: str, *, limit: int = 5) -> list[SearchHit]:
        """The best ``limit`` tools for ``query``, best first (tools sharing no term: none)."""
        scores = self.scores(query)
        for doc in self.exact(query):
            scores[doc] = scores.get(doc, 0.0) + EXACT_BONUS
        best = heapq.nlargest(limit, scores.items(), key=lambda item: (item[1], -item[0]))
        return [SearchHit(name=self.tools[d].name, score=s, tool=self.tools[d]) for d, s in best]


class ServerIndex:
    """Each server (tool group) as one document: all its tools' names, descriptions and
    parameters in one bag of words, ranked against a query by Okapi BM25.

    A request names its tool's domain more often than its tool: "log the meeting with the
    customer" shares "customer" and "meeting" with many HubSpot tools, while the wanted
    one may say neither; a server whose definitions together say much of the request is
    likely the right one. The hybrid ranker adds a share of this to each tool's score (a
    server prior, as cluster-based retrieval smooths a document with its cluster), with
    the weight fitted on the dev half of ``bench/data`` (``bench/tool_search_learned.py``).
    """

    def __init__(self, tools: Iterable[Tool], *, k1: float = 1.2, b: float = 0.75) -> None:
        self.tools = sorted(tools, key=lambda t: t.name)
        self.groups = sorted({t.group for t in self.tools})
        at = {g: i for i, g in enumerate(self.groups)}
        self.group_of = [at[t.group] for t in self.tools]  # by position in ``tools``
        bags: list[Counter[str]] = [Counter() for _ in self.groups]
        for t, g in zip(self.tools, self.group_of, strict=True):
            for text in tool_fields(t):
                bags[g].update(tokenize(text))
        lengths = [sum(bag.values()) for bag in bags]
        average = max(sum(lengths) / max(len(bags), 1), 1.0)
        df: Counter[str] = Counter(term for bag in bags for term in bag)
        n = len(bags)
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for g, bag in enumerate(bags):
            norm = k1 * (1 - b + b * lengths[g] / average)
            for term, tf in bag.items():
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                self._postings.setdefault(term, []).append((g, idf * tf * (k1 + 1) / (tf + norm)))

    def scores(self, terms: dict[str, float]) -> list[float]:
        """Each group's BM25 score for weighted query ``terms`` (as ``query_terms`` gives),
        over the best group's (all zero when no group shares a term)."""
        scores = [0.0] * len(self.groups)
        for term, times in terms.items():
            for g, contribution in self._postings.get(term, ()):
                scores[g] += times * contribution
        top = max(scores, default=0.0)
        return [s / top for s in scores] if top > 0 else scores
