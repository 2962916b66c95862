"""Rendering the memory context: an escaped XML block that always fits its budget."""
