"""Embedding: texts into unit vectors (the local ONNX model, a hashing stand-in, a remote endpoint)."""
