"""The private core: helpers every part may use, importing nothing else of lodger
(bulk frees, text escapes, record shapes, lazy exports, SQLite settings, eager tasks)."""
