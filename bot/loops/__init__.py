"""The loops beside the worker: what foreman does by itself, each through its repository's door (auto-allocation,
its queued triggers, the end of an issue's life, the runs' teardowns, start-up recovery)."""
