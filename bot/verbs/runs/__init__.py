"""Runs: starting a sealed run, its broker, and the trusted side (teardown, inspection)."""
