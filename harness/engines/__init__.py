"""Inference engines kvgate starts and stops itself as targets (vLLM)."""
