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
    (
        2,
        "issue state: comment records, issue snapshots, label events, blockers, label syncs",
        """
        -- Every issue comment event seen, one row per (delivery, comment): append-only history.
        -- A later revision of the same comment (edit, deletion) sets superseded_by once; nothing is deleted.
        CREATE TABLE issue_comment_records (
            id                 INTEGER PRIMARY KEY,
            repo               TEXT NOT NULL,
            number             INTEGER NOT NULL,
            comment_id         INTEGER NOT NULL,
            action             TEXT NOT NULL CHECK (action IN ('created', 'edited', 'deleted')),
            author             TEXT NOT NULL,
            comment_created_at TEXT NOT NULL,
            comment_updated_at TEXT NOT NULL,
            delivery_id        TEXT NOT NULL,
            body_sha256        TEXT NOT NULL,
            block_count        INTEGER NOT NULL,
            trusted            INTEGER CHECK (trusted IN (0, 1)),
            trust_reason       TEXT NOT NULL,
            state_json         TEXT,
            errors_json        TEXT NOT NULL,
            superseded_by      INTEGER REFERENCES issue_comment_records (id),
            recorded_at        TEXT NOT NULL
        );
        CREATE UNIQUE INDEX issue_comment_records_delivery ON issue_comment_records (delivery_id, comment_id);
        CREATE INDEX issue_comment_records_issue ON issue_comment_records (repo, number, comment_id);

        -- One row per issue: the current state (derived from the records) and the last known snapshot.
        CREATE TABLE issues (
            repo             TEXT NOT NULL,
            number           INTEGER NOT NULL,
            is_open          INTEGER CHECK (is_open IN (0, 1)),
            labels_json      TEXT,
            snapshot_as_of   TEXT,
            state_record_id  INTEGER REFERENCES issue_comment_records (id),
            state_comment_id INTEGER,
            state_json       TEXT,
            state_label      TEXT,
            candidate        INTEGER NOT NULL DEFAULT 0 CHECK (candidate IN (0, 1)),
            candidate_since  TEXT,
            label_sync       TEXT NOT NULL DEFAULT 'no_state'
                             CHECK (label_sync IN
                                 ('no_state', 'in_sync', 'held', 'pending', 'label_missing', 'failed')),
            version          INTEGER NOT NULL DEFAULT 0,
            created_at       TEXT NOT NULL,
            updated_at       TEXT NOT NULL,
            PRIMARY KEY (repo, number)
        );

        -- Every issues event (opened, closed, reopened, label_updated, label_cleared): the full label set it
        -- carried and the difference from the stored set. applied = 0: older than the stored snapshot.
        CREATE TABLE issue_events (
            id                 INTEGER PRIMARY KEY,
            repo               TEXT NOT NULL,
            number             INTEGER NOT NULL,
            delivery_id        TEXT NOT NULL,
            action             TEXT NOT NULL,
            sender             TEXT NOT NULL,
            issue_updated_at   TEXT NOT NULL,
            is_open            INTEGER NOT NULL CHECK (is_open IN (0, 1)),
            labels_json        TEXT NOT NULL,
            added_json         TEXT NOT NULL,
            removed_json       TEXT NOT NULL,
            first_snapshot     INTEGER NOT NULL CHECK (first_snapshot IN (0, 1)),
            applied            INTEGER NOT NULL CHECK (applied IN (0, 1)),
            made_candidate     INTEGER NOT NULL CHECK (made_candidate IN (0, 1)),
            recorded_at        TEXT NOT NULL
        );
        CREATE UNIQUE INDEX issue_events_delivery ON issue_events (delivery_id);
        CREATE INDEX issue_events_issue ON issue_events (repo, number, id);

        -- Problems for the controller. At most one open blocker per (issue, kind); resolving is an update.
        CREATE TABLE issue_blockers (
            id           INTEGER PRIMARY KEY,
            repo         TEXT NOT NULL,
            number       INTEGER NOT NULL,
            kind         TEXT NOT NULL,
            detail_json  TEXT NOT NULL,
            raised_at    TEXT NOT NULL,
            raised_by    TEXT NOT NULL,
            resolved_at  TEXT,
            resolved_by  TEXT
        );
        CREATE UNIQUE INDEX issue_blockers_open ON issue_blockers (repo, number, kind) WHERE resolved_at IS NULL;

        -- What label sync did (or could not do) to mirror a state's STATE in the issue's status label.
        -- queued: an outbox entry (outbox_key) was written in the same transaction; applied / label_missing /
        -- failed: what became of that entry (recorded by the outbox completion hook); held: two status labels.
        CREATE TABLE issue_label_syncs (
            id                 INTEGER PRIMARY KEY,
            repo               TEXT NOT NULL,
            number             INTEGER NOT NULL,
            state_record_id    INTEGER NOT NULL REFERENCES issue_comment_records (id),
            target_label       TEXT NOT NULL,
            outcome            TEXT NOT NULL
                               CHECK (outcome IN ('queued', 'applied', 'held', 'label_missing', 'failed')),
            reason             TEXT NOT NULL,
            labels_before_json TEXT NOT NULL,
            labels_after_json  TEXT,
            outbox_key         TEXT,
            delivery_id        TEXT NOT NULL,
            recorded_at        TEXT NOT NULL,
            CHECK ((outbox_key IS NULL) = (outcome = 'held'))
        );
        CREATE UNIQUE INDEX issue_label_syncs_held
            ON issue_label_syncs (repo, number, state_record_id, labels_before_json) WHERE outbox_key IS NULL;
        CREATE UNIQUE INDEX issue_label_syncs_entry
            ON issue_label_syncs (outbox_key, outcome) WHERE outbox_key IS NOT NULL;
        CREATE INDEX issue_label_syncs_issue ON issue_label_syncs (repo, number, state_record_id, id);
        """,
    ),
    (
        3,
        "outbox of intended Gitea mutations",
        """
        CREATE TABLE outbox (
            id              INTEGER PRIMARY KEY,
            idempotency_key TEXT NOT NULL,
            issue_number    INTEGER NOT NULL CHECK (issue_number > 0),
            kind            TEXT NOT NULL CHECK (kind IN ('comment', 'edit_comment', 'labels', 'assignees')),
            payload_json    TEXT NOT NULL,
            status          TEXT NOT NULL CHECK (status IN
                                ('pending', 'sending', 'done', 'verification_failed', 'parked')),
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TEXT,
            claimed_by      TEXT,
            claimed_at      TEXT,
            result_json     TEXT,
            observed_json   TEXT,
            last_error      TEXT,
            delivery_id     TEXT,
            created_at      TEXT NOT NULL,
            updated_at      TEXT NOT NULL,
            sent_at         TEXT,
            -- Settled entries run a hook (issue state follows what was verified); NULL until it ran, so a
            -- crash between settling and the hook is made good on the next pass.
            hooked_at       TEXT,
            hook_error      TEXT,
            version         INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX outbox_unhooked ON outbox (status, hooked_at);
        CREATE UNIQUE INDEX outbox_idempotency_key ON outbox (idempotency_key);
        CREATE INDEX outbox_issue ON outbox (issue_number, id);
        CREATE INDEX outbox_status ON outbox (status, next_attempt_at);
        """,
    ),
    (
        4,
        "leases and their events",
        """
        -- At most one live lease per issue, enforced by the database (a partial unique index).
        -- Leases are never deleted: release, expiry and reclaim are recorded on the row and in lease_events.
        CREATE TABLE leases (
            id            INTEGER PRIMARY KEY,
            lease_id      TEXT NOT NULL,
            repo          TEXT NOT NULL,
            issue_number  INTEGER NOT NULL CHECK (issue_number > 0),
            owner         TEXT NOT NULL,
            role          TEXT NOT NULL,
            action        TEXT NOT NULL,
            acquired_at   TEXT NOT NULL,
            expires_at    TEXT NOT NULL,
            heartbeat_at  TEXT NOT NULL,
            status        TEXT NOT NULL CHECK (status IN ('live', 'released', 'expired')),
            ended_at      TEXT,
            end_reason    TEXT,
            fingerprint   TEXT,
            request_json  TEXT NOT NULL,
            version       INTEGER NOT NULL DEFAULT 0
        );
        CREATE UNIQUE INDEX leases_lease_id ON leases (lease_id);
        CREATE UNIQUE INDEX leases_one_live_per_issue ON leases (repo, issue_number) WHERE status = 'live';
        CREATE INDEX leases_owner ON leases (owner, status);

        CREATE TABLE lease_events (
            id        INTEGER PRIMARY KEY,
            lease_id  TEXT NOT NULL REFERENCES leases (lease_id),
            kind      TEXT NOT NULL CHECK (kind IN ('acquired', 'resumed', 'heartbeat', 'released', 'expired',
                                                    'reclaimed')),
            actor     TEXT NOT NULL,
            at        TEXT NOT NULL,
            detail_json TEXT NOT NULL
        );
        CREATE INDEX lease_events_lease ON lease_events (lease_id, id);
        """,
    ),
)
