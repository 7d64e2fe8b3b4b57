"""Batched KV-cache engine, drafting (chain / tree / n-gram) and lossless verification."""
