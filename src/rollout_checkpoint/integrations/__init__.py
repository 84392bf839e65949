"""Integrations with other frameworks' servers (each imports its framework lazily: the rest of
the SDK never needs it)."""
