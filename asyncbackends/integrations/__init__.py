"""Integrations with evaluation frameworks."""
