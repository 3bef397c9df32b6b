"""The SQLite store: the schema and one module per aggregate."""
