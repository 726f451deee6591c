"""Integrations of wdiff.live with training frameworks (optional extras)."""
