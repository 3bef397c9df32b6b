"""The read-only dashboard: ``model`` reads the stores, ``render`` writes HTML, ``routes`` serves both."""
