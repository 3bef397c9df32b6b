"""Verbs: the one door (runtime) and one module per verb family."""
