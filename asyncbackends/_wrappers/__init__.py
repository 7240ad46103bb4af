"""Wrappers: backends that wrap backends (`ab.limited`, `ab.pool`), so every feature works through them."""
