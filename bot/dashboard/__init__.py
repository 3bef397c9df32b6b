"""The read-only dashboard (issue 18): ``model`` reads the stores into documents, ``render`` turns them into HTML,
``routes`` serves both under /dashboard behind ``[dashboard] token``."""
