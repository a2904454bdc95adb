"""lodger: a durable agent runtime."""
