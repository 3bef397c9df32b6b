"""Numbered schema migrations. Append only: a shipped migration is never edited."""

from __future__ import annotations

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "deliveries inbox",
        """
        CREATE TABLE deliveries (
            id              INTEGER PRIMARY KEY,
            delivery_id     TEXT NOT NULL,
            body_sha256     TEXT NOT NULL,
            event           TEXT NOT NULL,
            event_type      TEXT,
            action          TEXT,
            sender_login    TEXT,
            headers_json    TEXT NOT NULL,
            body            BLOB NOT NULL,
            received_at     TEXT NOT NULL,
            status          TEXT NOT NULL CHECK (status IN
                                ('queued', 'processing', 'done', 'failed', 'ignored_self')),
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TEXT,
            claimed_by      TEXT,
            heartbeat_at    TEXT,
            last_error      TEXT,
            finished_at     TEXT,
            version         INTEGER NOT NULL DEFAULT 0
        );
        CREATE UNIQUE INDEX deliveries_delivery_id ON deliveries (delivery_id);
        CREATE UNIQUE INDEX deliveries_body_sha256 ON deliveries (body_sha256);
        CREATE INDEX deliveries_due ON deliveries (status, next_attempt_at, id);

        -- One row per (delivery, handler): a handler that finished is never run again for that delivery,
        -- so a retry after a sibling's failure or a crash repeats only what did not finish.
        CREATE TABLE delivery_handlers (
            delivery_pk INTEGER NOT NULL REFERENCES deliveries (id),
            handler     TEXT NOT NULL,
            status      TEXT NOT NULL CHECK (status IN ('done', 'error')),
            attempts    INTEGER NOT NULL DEFAULT 0,
            last_error  TEXT,
            updated_at  TEXT NOT NULL,
            PRIMARY KEY (delivery_pk, handler)
        );

        -- Replays by an operator are recorded, never silent.
        CREATE TABLE delivery_replays (
            id           INTEGER PRIMARY KEY,
            delivery_pk  INTEGER NOT NULL REFERENCES deliveries (id),
            from_status  TEXT NOT NULL,
            requested_at TEXT NOT NULL,
            requested_by TEXT NOT NULL
        );
        """,
    ),
)
