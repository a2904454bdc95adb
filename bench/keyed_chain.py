"""What a keyed chain costs: sealing and decoding one event, HMAC-SHA256 against sha256.

Sealing is on the hot path of every commit (T1, T2), decoding on every full read. Both
series run in the same process, interleaved, on the same drafts; the result is the
per-event difference in microseconds and the ratio keyed / plain. The last line of
output is one JSON object.

Example:
    .venv/bin/python bench/keyed_chain.py
    .venv/bin/python bench/keyed_chain.py --size 4000 --rounds 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

from lodger.events import EventDraft, ToolResponded, decode_event, seal
from lodger.storage import LogKey

TARGET_US = 5.0  # the keyed chain may add at most this much per sealed event


def make_draft(n: int, size: int) -> EventDraft:
    content = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    return EventDraft(
        id=f"bench-{n:08d}",
        ts=1_700_000_000_000_000 + n,
        body=ToolResponded(operation_id=f"op-{n:08d}", status="ok", content=content),
        turn_id="turn-1",
        run_id="run-1",
        call_id=f"call-{n:08d}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=500, help="content bytes per event")
    parser.add_argument("--number", type=int, default=20_000, help="events per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    mac = LogKey(bytes(range(32))).mac
    draft = make_draft(1, args.size)
    prev = "ab" * 32
    plain_event, plain_data = seal(draft, session_id="s", offset=1, prev_digest=prev)
    keyed_event, keyed_data = seal(draft, session_id="s", offset=1, prev_digest=prev, mac=mac)

    series: dict[str, list[float]] = {
        "seal": [],
        "seal_keyed": [],
        "decode": [],
        "decode_keyed": [],
    }
    calls = {
        "seal": lambda: seal(draft, session_id="s", offset=1, prev_digest=prev),
        "seal_keyed": lambda: seal(draft, session_id="s", offset=1, prev_digest=prev, mac=mac),
        "decode": lambda: decode_event(
            plain_data, session_id="s", offset=1, digest=plain_event.digest, prev_digest=prev
        ),
        "decode_keyed": lambda: decode_event(
            keyed_data,
            session_id="s",
            offset=1,
            digest=keyed_event.digest,
            prev_digest=prev,
            mac=mac,
        ),
    }
    for _ in range(args.rounds):  # interleaved, so drift affects every series alike
        for name, call in calls.items():
            series[name].append(timeit.timeit(call, number=args.number) / args.number * 1e6)

    median = {name: statistics.median(values) for name, values in series.items()}
    result = {
        "event_bytes": len(plain_data),
        "seal_us": round(median["seal"], 3),
        "seal_keyed_us": round(median["seal_keyed"], 3),
        "seal_extra_us": round(median["seal_keyed"] - median["seal"], 3),
        "seal_ratio": round(median["seal_keyed"] / median["seal"], 3),
        "decode_us": round(median["decode"], 3),
        "decode_keyed_us": round(median["decode_keyed"], 3),
        "decode_extra_us": round(median["decode_keyed"] - median["decode"], 3),
        "decode_ratio": round(median["decode_keyed"] / median["decode"], 3),
        "target_extra_us": TARGET_US,
    }
    result["ok"] = result["seal_extra_us"] <= TARGET_US
    print(
        f"seal:   plain {result['seal_us']} us, keyed {result['seal_keyed_us']} us "
        f"(+{result['seal_extra_us']} us, x{result['seal_ratio']})"
    )
    print(
        f"decode: plain {result['decode_us']} us, keyed {result['decode_keyed_us']} us "
        f"(+{result['decode_extra_us']} us, x{result['decode_ratio']})"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
