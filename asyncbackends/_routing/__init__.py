"""Routing: one `Router` over a set of replicas (state, limits, choice, health) that pools and Ray share."""
