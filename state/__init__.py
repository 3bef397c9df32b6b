"""The store (SQLite or PostgreSQL): the schema and one module per aggregate."""
