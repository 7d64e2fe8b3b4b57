"""Coordinator and workers on Ray."""
