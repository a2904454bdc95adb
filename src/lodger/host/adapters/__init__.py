"""Alternate stream endpoints: a turn's committed facts plus its text deltas, translated
into the stream protocols front-end libraries already consume.

``lodger.host.adapters.turn`` follows one turn and reduces its facts and deltas to a
few protocol-neutral moves (text, calls, approvals, results, the end); each protocol is
one module that encodes those moves: ``vercel`` (the Vercel AI SDK's UI message stream,
what ``useChat`` reads) and ``agui`` (AG-UI events, what an ``HttpAgent`` reads). The
log stays the truth: an adapter adds nothing to it and reads only what the session's
stream would carry.
"""
