"""The pure domain core: decisions over plain data, no I/O."""
