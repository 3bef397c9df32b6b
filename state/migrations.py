"""Numbered schema migrations. Append only: a shipped migration is never edited."""
# Over 600 lines by nature (issue 30): append-only SQL, one text per schema version; split, it would only scatter them.

from __future__ import annotations

# The inbox's schema as migration 1 created it and migration 7 rebuilt it (SQLite cannot change a CHECK in place:
# the same columns, 'ignored' allowed, ignored_reason added), named once so both read the same text. Every shipped
# migration's text is pinned by its SHA-256 in tests/test_migrations.py: editing one of these fails there.
_INBOX_HEAD = """
            id              INTEGER PRIMARY KEY,
            delivery_id     TEXT NOT NULL,
            body_sha256     TEXT NOT NULL,
            event           TEXT NOT NULL,
            event_type      TEXT,
            action          TEXT,
            sender_login    TEXT,
            headers_json    TEXT NOT NULL,
            body            BLOB NOT NULL,
            received_at     TEXT NOT NULL,"""
_INBOX_TAIL = """
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TEXT,
            claimed_by      TEXT,
            heartbeat_at    TEXT,
            last_error      TEXT,
            finished_at     TEXT,
            version         INTEGER NOT NULL DEFAULT 0"""
_INBOX_INDEXES = """
        CREATE UNIQUE INDEX deliveries_delivery_id ON deliveries (delivery_id);
        CREATE UNIQUE INDEX deliveries_body_sha256 ON deliveries (body_sha256);
        CREATE INDEX deliveries_due ON deliveries (status, next_attempt_at, id);"""
_HANDLERS_TABLE = """
        CREATE TABLE delivery_handlers (
            delivery_pk INTEGER NOT NULL REFERENCES deliveries (id),
            handler     TEXT NOT NULL,
            status      TEXT NOT NULL CHECK (status IN ('done', 'error')),
            attempts    INTEGER NOT NULL DEFAULT 0,
            last_error  TEXT,
            updated_at  TEXT NOT NULL,
            PRIMARY KEY (delivery_pk, handler)
        );"""
_REPLAYS_TABLE = """
        CREATE TABLE delivery_replays (
            id           INTEGER PRIMARY KEY,
            delivery_pk  INTEGER NOT NULL REFERENCES deliveries (id),
            from_status  TEXT NOT NULL,
            requested_at TEXT NOT NULL,
            requested_by TEXT NOT NULL
        );"""

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "deliveries inbox",
        f"""
        CREATE TABLE deliveries ({_INBOX_HEAD}
            status          TEXT NOT NULL CHECK (status IN
                                ('queued', 'processing', 'done', 'failed', 'ignored_self')),{_INBOX_TAIL}
        );{_INBOX_INDEXES}

        -- One row per (delivery, handler): a handler that finished is never run again for that delivery,
        -- so a retry after a sibling's failure or a crash repeats only what did not finish.{_HANDLERS_TABLE}

        -- Replays by an operator are recorded, never silent.{_REPLAYS_TABLE}
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
    (
        5,
        "worktree bootstrap: phase journal, worktree registrations, issue locks",
        """
        -- One row per bootstrap transition, keyed by its idempotency key; phase moves forward only through
        -- conditional updates (WHERE phase = ? AND version = ?). outcome mirrors the phase so that the partial
        -- unique indexes below can say: one open transition per issue and per worktree path, and one completed
        -- transition per lease.
        CREATE TABLE bootstrap_journal (
            id              INTEGER PRIMARY KEY,
            idempotency_key TEXT NOT NULL,
            key_source      TEXT NOT NULL CHECK (key_source IN ('caller', 'derived')),
            repo            TEXT NOT NULL,
            issue_number    INTEGER NOT NULL CHECK (issue_number > 0),
            lease_id        TEXT NOT NULL REFERENCES leases (lease_id),
            owner           TEXT NOT NULL,
            role            TEXT NOT NULL,
            attempt         INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
            base_branch     TEXT NOT NULL,
            base_sha        TEXT NOT NULL,
            branch          TEXT NOT NULL,
            checkout_path   TEXT NOT NULL,
            worktree_path   TEXT NOT NULL,
            inputs_json     TEXT NOT NULL,
            phase           TEXT NOT NULL CHECK (phase IN ('accepted', 'branch_confirmed', 'path_reserved',
                                'worktree_confirmed', 'registration_verified', 'lock_established', 'completed',
                                'compensation_required', 'compensation_completed')),
            outcome         TEXT NOT NULL CHECK (outcome IN ('open', 'completed', 'compensated')),
            failed_phase    TEXT,
            error_json      TEXT,
            result_json     TEXT,
            created_at      TEXT NOT NULL,
            updated_at      TEXT NOT NULL,
            version         INTEGER NOT NULL DEFAULT 0,
            CHECK ((outcome = 'completed') = (phase = 'completed')),
            CHECK ((outcome = 'compensated') = (phase = 'compensation_completed'))
        );
        CREATE UNIQUE INDEX bootstrap_journal_key ON bootstrap_journal (idempotency_key);
        CREATE UNIQUE INDEX bootstrap_journal_open_issue ON bootstrap_journal (repo, issue_number)
            WHERE outcome = 'open';
        CREATE UNIQUE INDEX bootstrap_journal_open_path ON bootstrap_journal (worktree_path) WHERE outcome = 'open';
        CREATE UNIQUE INDEX bootstrap_journal_completed_lease ON bootstrap_journal (lease_id)
            WHERE outcome = 'completed';
        CREATE INDEX bootstrap_journal_issue ON bootstrap_journal (repo, issue_number, id);

        -- Each phase a transition reached, once, with the read-after-write proof observed when it was recorded.
        CREATE TABLE bootstrap_phases (
            id          INTEGER PRIMARY KEY,
            journal_id  INTEGER NOT NULL REFERENCES bootstrap_journal (id),
            phase       TEXT NOT NULL,
            proof_json  TEXT NOT NULL,
            runner      TEXT NOT NULL,
            recorded_at TEXT NOT NULL
        );
        CREATE UNIQUE INDEX bootstrap_phases_once ON bootstrap_phases (journal_id, phase);

        -- A worktree bound to a lease by a transition (the lock verb trusts nothing else). Ended, never deleted.
        CREATE TABLE worktree_registrations (
            id               INTEGER PRIMARY KEY,
            journal_id       INTEGER NOT NULL REFERENCES bootstrap_journal (id),
            repo             TEXT NOT NULL,
            issue_number     INTEGER NOT NULL CHECK (issue_number > 0),
            lease_id         TEXT NOT NULL REFERENCES leases (lease_id),
            owner            TEXT NOT NULL,
            branch           TEXT NOT NULL,
            worktree_path    TEXT NOT NULL,
            created_branch   INTEGER NOT NULL CHECK (created_branch IN (0, 1)),
            created_worktree INTEGER NOT NULL CHECK (created_worktree IN (0, 1)),
            registered_at    TEXT NOT NULL,
            ended_at         TEXT,
            end_reason       TEXT
        );
        CREATE UNIQUE INDEX worktree_registrations_live_path ON worktree_registrations (worktree_path)
            WHERE ended_at IS NULL;
        CREATE UNIQUE INDEX worktree_registrations_live_issue ON worktree_registrations (repo, issue_number)
            WHERE ended_at IS NULL;

        -- Issue locks: (issue, lease, worktree). At most one unreleased lock per issue; released, never deleted.
        CREATE TABLE issue_locks (
            id              INTEGER PRIMARY KEY,
            lock_id         TEXT NOT NULL,
            repo            TEXT NOT NULL,
            issue_number    INTEGER NOT NULL CHECK (issue_number > 0),
            lease_id        TEXT NOT NULL REFERENCES leases (lease_id),
            owner           TEXT NOT NULL,
            registration_id INTEGER NOT NULL REFERENCES worktree_registrations (id),
            branch          TEXT NOT NULL,
            worktree_path   TEXT NOT NULL,
            proof_json      TEXT NOT NULL,
            acquired_at     TEXT NOT NULL,
            released_at     TEXT,
            release_reason  TEXT
        );
        CREATE UNIQUE INDEX issue_locks_lock_id ON issue_locks (lock_id);
        CREATE UNIQUE INDEX issue_locks_live ON issue_locks (repo, issue_number) WHERE released_at IS NULL;
        """,
    ),
    (
        6,
        "run grants: sealed grants, run state, admission decisions",
        """
        -- A sealed grant is written once and never changed or deleted (the triggers refuse both); its body is
        -- canonical JSON whose digest the broker recomputes on every load.
        CREATE TABLE grants (
            run_id          TEXT PRIMARY KEY,
            grant_digest    TEXT NOT NULL,
            policy_key      TEXT NOT NULL,
            policy_digest   TEXT NOT NULL,
            contract_digest TEXT NOT NULL,
            host_id         TEXT NOT NULL,
            repo            TEXT NOT NULL,
            issue_number    INTEGER NOT NULL CHECK (issue_number > 0),
            owner           TEXT NOT NULL,
            lease_id        TEXT NOT NULL,
            worktree_uuid   TEXT NOT NULL,
            expires_at      TEXT NOT NULL,
            body_json       TEXT NOT NULL,
            sealed_at       TEXT NOT NULL,
            sealed_by       TEXT NOT NULL
        );
        CREATE UNIQUE INDEX grants_digest ON grants (grant_digest);
        CREATE INDEX grants_issue ON grants (repo, issue_number);
        CREATE TRIGGER grants_sealed_no_update BEFORE UPDATE ON grants
            BEGIN SELECT RAISE(ABORT, 'sealed grants are immutable'); END;
        CREATE TRIGGER grants_sealed_no_delete BEFORE DELETE ON grants
            BEGIN SELECT RAISE(ABORT, 'sealed grants are immutable'); END;

        -- Where each run's plan stands. Changed only by conditional writes (WHERE version = ?). At most one open
        -- run per worktree; the run token is stored only as its SHA-256.
        CREATE TABLE grant_runs (
            run_id         TEXT PRIMARY KEY REFERENCES grants (run_id),
            token_sha256   TEXT NOT NULL,
            worktree_uuid  TEXT NOT NULL,
            next_position  INTEGER NOT NULL DEFAULT 0 CHECK (next_position >= 0),
            inflight_json  TEXT,
            outcome        TEXT CHECK (outcome IN ('completed', 'failed', 'aborted', 'expired')),
            teardown       TEXT NOT NULL DEFAULT 'pending'
                           CHECK (teardown IN ('pending', 'admitted', 'done', 'failed', 'unresolved')),
            closed_at      TEXT,
            version        INTEGER NOT NULL DEFAULT 0,
            created_at     TEXT NOT NULL,
            updated_at     TEXT NOT NULL
        );
        CREATE UNIQUE INDEX grant_runs_token ON grant_runs (token_sha256);
        CREATE UNIQUE INDEX grant_runs_open_worktree ON grant_runs (worktree_uuid) WHERE closed_at IS NULL;
        CREATE INDEX grant_runs_worktree_outcome ON grant_runs (worktree_uuid, outcome);

        -- Every broker decision, refusals included; append-only. A plan position is admitted at most once, by any
        -- broker, ever (so a consumed grant cannot be replayed and the teardown runs once); a call settles once.
        CREATE TABLE grant_decisions (
            id               INTEGER PRIMARY KEY,
            run_id           TEXT NOT NULL REFERENCES grants (run_id),
            kind             TEXT NOT NULL CHECK (kind IN ('admitted', 'denied', 'accepted', 'refused', 'aborted',
                                 'reconciled', 'broker_error')),
            category         TEXT CHECK (category IN ('grant_denied', 'grant_expired', 'host_mismatch',
                                 'inflight_unresolved', 'broker_error')),
            reason           TEXT NOT NULL,
            position         INTEGER,
            call_id          TEXT,
            tool             TEXT,
            arguments_digest TEXT,
            result_digest    TEXT,
            inert            INTEGER NOT NULL DEFAULT 0 CHECK (inert IN (0, 1)),
            settles          INTEGER NOT NULL DEFAULT 0 CHECK (settles IN (0, 1)),
            host_id          TEXT NOT NULL,
            broker_id        TEXT NOT NULL,
            state_version    INTEGER NOT NULL,
            at               TEXT NOT NULL,
            detail_json      TEXT NOT NULL
        );
        CREATE INDEX grant_decisions_run ON grant_decisions (run_id, id);
        CREATE UNIQUE INDEX grant_decisions_one_admission ON grant_decisions (run_id, position)
            WHERE kind = 'admitted';
        CREATE UNIQUE INDEX grant_decisions_one_settlement ON grant_decisions (run_id, call_id) WHERE settles = 1;
        """,
    ),
    (
        7,
        "deliveries: 'ignored' with its reason (another repository, nothing to dispatch)",
        f"""
        -- SQLite cannot change a CHECK in place: the inbox is rebuilt with the same columns and ids. The two
        -- tables that point at it are set aside and rebuilt after it, so no foreign key is ever dangling.
        CREATE TABLE delivery_handlers_v6 AS SELECT * FROM delivery_handlers;
        CREATE TABLE delivery_replays_v6 AS SELECT * FROM delivery_replays;
        DROP TABLE delivery_handlers;
        DROP TABLE delivery_replays;
        CREATE TABLE deliveries_v7 ({_INBOX_HEAD}
            status          TEXT NOT NULL CHECK (status IN
                                ('queued', 'processing', 'done', 'failed', 'ignored_self', 'ignored')),{_INBOX_TAIL},
            ignored_reason  TEXT
        );
        INSERT INTO deliveries_v7 (id, delivery_id, body_sha256, event, event_type, action, sender_login,
            headers_json, body, received_at, status, attempts, next_attempt_at, claimed_by, heartbeat_at,
            last_error, finished_at, version)
            SELECT id, delivery_id, body_sha256, event, event_type, action, sender_login, headers_json, body,
                received_at, status, attempts, next_attempt_at, claimed_by, heartbeat_at, last_error, finished_at,
                version FROM deliveries;
        DROP TABLE deliveries;
        ALTER TABLE deliveries_v7 RENAME TO deliveries;{_INBOX_INDEXES}{_HANDLERS_TABLE}
        INSERT INTO delivery_handlers SELECT * FROM delivery_handlers_v6;
        DROP TABLE delivery_handlers_v6;{_REPLAYS_TABLE}
        INSERT INTO delivery_replays SELECT * FROM delivery_replays_v6;
        DROP TABLE delivery_replays_v6;
        """,  # noqa: S608 (a constant: the fragments above, nothing received)
    ),
    (
        8,
        "auto-allocation decisions: every automatic decision with its author pick and skipped accounting",
        """
        CREATE TABLE auto_allocations (
            id          INTEGER PRIMARY KEY,
            repo        TEXT NOT NULL,
            decided_at  TEXT NOT NULL,
            trigger     TEXT NOT NULL,
            delivery_id TEXT,
            doc_json    TEXT NOT NULL
        );
        CREATE INDEX auto_allocations_recent ON auto_allocations (repo, id);
        """,
    ),
    (
        9,
        "a controller's standing exclusions: the exclusions it last stated, applied to auto-allocation",
        """
        CREATE TABLE controller_exclusions (
            id            INTEGER PRIMARY KEY,
            repo          TEXT NOT NULL,
            controller    TEXT NOT NULL,
            issue_numbers TEXT NOT NULL,
            stated_at     TEXT NOT NULL,
            via           TEXT
        );
        CREATE INDEX controller_exclusions_latest ON controller_exclusions (repo, controller, id);
        """,
    ),
    (
        10,
        "catch-up: each reconcile pass with its watermark and findings; comment commands run once",
        """
        CREATE TABLE reconcile_passes (
            id             INTEGER PRIMARY KEY,
            repo           TEXT NOT NULL,
            trigger        TEXT NOT NULL,
            started_at     TEXT NOT NULL,
            finished_at    TEXT,
            since          TEXT,
            watermark      TEXT,
            outcome        TEXT NOT NULL CHECK (outcome IN ('running', 'ok', 'baseline', 'error')),
            calls          INTEGER NOT NULL DEFAULT 0,
            read_issues    INTEGER NOT NULL DEFAULT 0,
            read_comments  INTEGER NOT NULL DEFAULT 0,
            found_json     TEXT NOT NULL DEFAULT '{}',
            error          TEXT,
            down_from      TEXT,
            down_seconds   REAL
        );
        CREATE INDEX reconcile_passes_recent ON reconcile_passes (repo, id);
        CREATE TABLE reconcile_heartbeats (
            repo    TEXT PRIMARY KEY,
            seen_at TEXT NOT NULL
        );
        CREATE TABLE command_claims (
            repo        TEXT NOT NULL,
            comment_id  INTEGER NOT NULL,
            delivery_id TEXT NOT NULL,
            claimed_at  TEXT NOT NULL,
            PRIMARY KEY (repo, comment_id)
        );
        """,
    ),
    (
        11,
        "publishing an issue branch (commit, push, read-back journal) and the pull request opened for an issue",
        """
        CREATE TABLE publications (
            id             INTEGER PRIMARY KEY,
            repo           TEXT NOT NULL,
            issue_number   INTEGER NOT NULL,
            key            TEXT NOT NULL,
            lease_id       TEXT NOT NULL,
            owner          TEXT NOT NULL,
            branch         TEXT NOT NULL,
            worktree_path  TEXT NOT NULL,
            message_digest TEXT NOT NULL,
            phase          TEXT NOT NULL CHECK (phase IN ('started', 'committed', 'pushed', 'verified')),
            parent_sha     TEXT,
            commit_sha     TEXT,
            remote_before  TEXT,
            result_json    TEXT,
            created_at     TEXT NOT NULL,
            updated_at     TEXT NOT NULL,
            UNIQUE (repo, key)
        );
        CREATE INDEX publications_by_branch ON publications (repo, branch, phase);
        CREATE TABLE issue_pulls (
            repo         TEXT NOT NULL,
            issue_number INTEGER NOT NULL,
            pr_number    INTEGER NOT NULL,
            head         TEXT NOT NULL,
            base         TEXT NOT NULL,
            opened_by    TEXT NOT NULL,
            adopted      INTEGER NOT NULL DEFAULT 0,
            recorded_at  TEXT NOT NULL,
            PRIMARY KEY (repo, issue_number, pr_number)
        );
        """,
    ),
    (
        12,
        "teardowns: the end of each issue's life, once per pull request or closing",
        """
        CREATE TABLE teardowns (
            key           TEXT PRIMARY KEY,
            repo          TEXT NOT NULL,
            issue_number  INTEGER NOT NULL,
            reason        TEXT NOT NULL CHECK (reason IN ('merged', 'pr_closed', 'issue_closed')),
            pr_number     INTEGER,
            trigger       TEXT NOT NULL,
            delivery_id   TEXT,
            outcome_json  TEXT NOT NULL,
            created_at    TEXT NOT NULL
        );
        CREATE INDEX teardowns_issue ON teardowns (repo, issue_number);
        """,
    ),
    (
        13,
        "outbox: each entry filed under its repository (many repositories in one process)",
        """
        ALTER TABLE outbox ADD COLUMN repo TEXT NOT NULL DEFAULT '';
        DROP INDEX outbox_idempotency_key;
        CREATE UNIQUE INDEX outbox_idempotency_key ON outbox (repo, idempotency_key);
        DROP INDEX outbox_issue;
        CREATE INDEX outbox_issue ON outbox (repo, issue_number, id);
        """,
    ),
    (
        14,
        "leases: what auto-allocation reads on every run, each a seek (when each owner's latest lease ended; the"
        " review leases waiting for their implementer; an issue's newest lease)",
        """
        CREATE INDEX leases_owner_ended ON leases (repo, owner, ended_at) WHERE ended_at IS NOT NULL;
        CREATE INDEX leases_reviewed ON leases (repo, issue_number, id)
            WHERE action = 'review' AND status = 'released' AND end_reason = 'reviewed';
        CREATE INDEX leases_issue ON leases (repo, issue_number, id);
        """,
    ),
    (
        15,
        "command claims: the command each comment's claim is for and when it finished (a finished command never runs"
        " again, whoever replays its delivery); what each replay skipped",
        """
        ALTER TABLE command_claims ADD COLUMN command TEXT;
        ALTER TABLE command_claims ADD COLUMN finished_at TEXT;
        ALTER TABLE delivery_replays ADD COLUMN skipped_json TEXT;
        -- A claim whose delivery (or whose command handler) finished before this migration ran its command.
        UPDATE command_claims SET finished_at = claimed_at WHERE EXISTS (
            SELECT 1 FROM deliveries d WHERE d.delivery_id = command_claims.delivery_id AND (d.status = 'done'
            OR EXISTS (SELECT 1 FROM delivery_handlers h WHERE h.delivery_pk = d.id
                       AND h.handler = 'handlers.verb_commands.on_command' AND h.status = 'done')));
        """,
    ),
    (
        16,
        "standing exclusions per action: what a controller states in a review allocation stands for reviews only"
        " (the statements made before keep standing for implement, as they did)",
        """
        ALTER TABLE controller_exclusions ADD COLUMN action TEXT NOT NULL DEFAULT 'implement';
        -- Each controller's latest statement for one action: one seek per (repo, action, controller).
        DROP INDEX controller_exclusions_latest;
        CREATE INDEX controller_exclusions_latest ON controller_exclusions (repo, action, controller, id);
        """,
    ),
    (
        17,
        "what each life reads of the journal and the publications, each a seek (issue 35: these read every row ever"
        " written, a scan that grew with every life)",
        """
        -- An issue's registrations (the teardown, the publish); a bootstrap's latest registration (its proof).
        CREATE INDEX worktree_registrations_issue ON worktree_registrations (repo, issue_number, id);
        CREATE INDEX worktree_registrations_journal ON worktree_registrations (journal_id, id);
        -- A lease's compensated bootstraps (the allocation's retry budget).
        CREATE INDEX bootstrap_journal_lease ON bootstrap_journal (lease_id, outcome);
        -- A publish's unfinished attempt and an issue's publications.
        CREATE INDEX publications_issue ON publications (repo, issue_number, id);
        """,
    ),
)
