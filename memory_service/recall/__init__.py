"""Recall: search (full text and vectors fused), the memory block for one model call, its XML rendering,
and the startup records every block begins with."""
