"""Prometheus-style metrics of the host, in the plain text exposition format.

``lodger_host_requests_total{method,route,status}``, ``lodger_host_active_streams``,
``lodger_host_pending_approvals`` (calls waiting for an answer in this process),
``lodger_host_turns_total`` and ``lodger_host_commit_seconds`` (a histogram of how long a
call's T1 and T2 facts took from being drafted to being durable, observed as each commits).
No labels carry a session id, a token or an argument.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable

from lodger.events import Event

__all__ = ["HostMetrics"]

#: the methods counted by name; any other (a client may send any token) counts as "other",
#: so no client can add series without bound
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class HostMetrics:
    def __init__(self, *, now_us: Callable[[], int] | None = None) -> None:
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.active_streams = 0
        self.streams_total = 0
        self._now_us = now_us or (lambda: time.time_ns() // 1000)
        self._commit_counts = [0] * (len(_BUCKETS) + 1)
        self._commit_sum = 0.0

    def request(self, method: str, route: str, status: int) -> None:
        self.requests[(method if method in _METHODS else "other", route, status)] += 1

    def observe(self, event: Event) -> None:
        """A journal observer: the commit latency of T1 and T2 facts."""
        if event.kind not in ("tool_dispatched", "tool_responded"):
            return
        seconds = max(self._now_us() - event.ts, 0) / 1e6
        self._commit_counts[bisect.bisect_left(_BUCKETS, seconds)] += 1
        self._commit_sum += seconds

    def render(self, *, pending_approvals: int, turns: int) -> str:
        lines = [
            "# HELP lodger_host_requests_total HTTP requests answered, by route and status.",
            "# TYPE lodger_host_requests_total counter",
        ]
        for (method, route, status), count in sorted(self.requests.items()):
            lines.append(
                f'lodger_host_requests_total{{method="{method}",route="{_escape(route)}",'
                f'status="{status}"}} {count}'
            )
        lines += [
            "# HELP lodger_host_active_streams Event streams open now.",
            "# TYPE lodger_host_active_streams gauge",
            f"lodger_host_active_streams {self.active_streams}",
            "# HELP lodger_host_streams_total Event streams opened.",
            "# TYPE lodger_host_streams_total counter",
            f"lodger_host_streams_total {self.streams_total}",
            "# HELP lodger_host_pending_approvals Calls waiting for an approval.",
            "# TYPE lodger_host_pending_approvals gauge",
            f"lodger_host_pending_approvals {pending_approvals}",
            "# HELP lodger_host_turns_total Turns the host ran to a result.",
            "# TYPE lodger_host_turns_total counter",
            f"lodger_host_turns_total {turns}",
            "# HELP lodger_host_commit_seconds Time from drafting a T1/T2 fact to its commit.",
            "# TYPE lodger_host_commit_seconds histogram",
        ]
        total = 0
        for bound, count in zip(_BUCKETS, self._commit_counts, strict=False):
            total += count
            lines.append(f'lodger_host_commit_seconds_bucket{{le="{bound}"}} {total}')
        total += self._commit_counts[-1]
        lines += [
            f'lodger_host_commit_seconds_bucket{{le="+Inf"}} {total}',
            f"lodger_host_commit_seconds_sum {self._commit_sum:.6f}",
            f"lodger_host_commit_seconds_count {total}",
        ]
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
