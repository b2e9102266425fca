-- Consumption records and dead letters: the statements of atomic and
-- batched modes (store.go, queries.go). Loaded by name (internal/namedsql);
-- {{.records}} and {{.dead_letters}} are the store's quoted, schema-qualified
-- tables (Config.Schema, RecordsTable, DeadLettersTable).

-- fragment: record_match
-- The id of the record holding (scope $1, message ID $2) or, failing that,
-- (scope $1, non-empty business key $3). A union of two index lookups, so
-- that even a generic plan of a prepared statement (pgx caches statements;
-- Postgres switches to generic plans) never scans the table: an OR over the
-- two keys would.
select id from (
    select id, 0 as pri from {{.records}} where scope = $1 and message_id = $2
    union all
    select id, 1 from {{.records}} where scope = $1 and business_key = $3 and business_key <> ''
  ) m order by pri limit 1

-- name: claim_insert
-- One statement claims: a conflict on either unique index (message ID, or
-- non-empty business key) inserts nothing and returns no row.
-- $1 scope, $2 message ID, $3 business key, $4 fingerprint, $5 its key ID,
-- $6 status, $7 attempts, $8 last error ('' = null), $9 its class ('' =
-- null), $10 source, $11 reconsume times, $12 seconds to expiry (null: never).
insert into {{.records}} as r
  (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts,
   last_error, last_error_class, source, reconsume_times, expires_at)
values ($1, $2, $3, $4, $5, $6, $7, nullif($8, ''), nullif($9, ''), $10, $11,
        now() + make_interval(secs => $12::float8))
on conflict do nothing
returning id;

-- fragment: record_found
-- The record matching ($1, $2, $3) as record_lock returns it, read without a
-- lock; the columns a claim returns when the record exists.
select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts
from {{.records}}
where id = ({{template "record_match" .}})

-- name: record_claim
-- One read decides whether anything is written: when a record holds either
-- unique key, it comes back as read (no lock, no insert attempted, so a
-- duplicate of a terminal record writes nothing); otherwise the new record
-- is inserted, and a conflict with a concurrent claim inserts nothing (no
-- row for either: the caller looks again). Always one row: the new id (null
-- when nothing was inserted), then the existing record (nulls when none).
-- Parameters as claim_insert.
with found as ({{template "record_found" .}}),
ins as (
  insert into {{.records}} as r
    (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts,
     last_error, last_error_class, source, reconsume_times, expires_at)
  select $1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::integer, nullif($8::text, ''),
         nullif($9::text, ''), $10::text, $11::integer, now() + make_interval(secs => $12::float8)
  where not exists (select 1 from found)
  on conflict do nothing
  returning id)
select (select id from ins), f.id, f.message_id, f.business_key, f.fingerprint, f.fingerprint_key_id, f.status, f.attempts
from (values (1)) one (x) left join found f on true;

-- name: record_lock_open
-- record_lock for a record that is not terminal (PROCESSING or
-- FAILED_RETRYABLE) only: a SUCCEEDED or FAILED_FINAL record is never
-- locked (its duplicates are answered from record_claim's read). A record
-- that became terminal while this statement waited for its lock is not
-- returned (the status is checked again on the row version it locks).
select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts
from {{.records}}
where id = ({{template "record_match" .}}) and status in ('PROCESSING', 'FAILED_RETRYABLE')
for update;

-- name: record_lock
-- The record matching the message ID wins over one matching only the
-- business key. FOR UPDATE makes a second copy wait for the first.
select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts
from {{.records}}
where id = ({{template "record_match" .}})
for update;

-- name: handler_savepoint
-- Set before every handler run, so that a failing handler rolls back alone
-- and its failure is marked in the same transaction.
savepoint idemq_handler;

-- name: handler_rollback
rollback to savepoint idemq_handler;

-- name: handler_release
-- Releases the handler's savepoint once it can no longer be needed (the
-- message's handler and mark are done), so that a batch's savepoints never
-- nest: queued ahead of the next message's claim, in the same round trip.
release savepoint idemq_handler;

-- name: record_reclaim
-- $1 record id, $2 source, $3 reconsume times.
update {{.records}}
set status = 'PROCESSING', attempts = attempts + 1, source = $2, reconsume_times = $3, updated_at = now()
where id = $1 and status = 'FAILED_RETRYABLE'
returning attempts;

-- name: record_set_fingerprint
-- A record rejected before its payload could be fingerprinted, re-driven
-- since, takes the fingerprint of the first copy that reaches it.
update {{.records}} set fingerprint = $2, fingerprint_key_id = $3 where id = $1;

-- name: record_mark_succeeded
-- $1 record id, $2 seconds to expiry.
update {{.records}}
set status = 'SUCCEEDED', updated_at = now(), expires_at = now() + make_interval(secs => $2::float8)
where id = $1 and status = 'PROCESSING';

-- name: record_mark_failed
-- $1 record id, $2 status, $3 error, $4 its class, $5 seconds to expiry
-- (null: never), $6 whether this mark counts a new attempt (false when the
-- claim in the same transaction already counted it), $7 source, $8
-- reconsume times.
update {{.records}}
set status = $2, attempts = attempts + case when $6 then 1 else 0 end, last_error = $3, last_error_class = $4,
    source = $7, reconsume_times = $8, updated_at = now(),
    expires_at = now() + make_interval(secs => $5::float8)
where id = $1;

-- name: dead_letter_insert
-- The partial unique index on live dead letters makes a repeated poison
-- message or conflict write one row, not one per copy.
insert into {{.dead_letters}}
  (scope, message_id, business_key, reason, error, error_class, fingerprint, attempts,
   topic, message_key, headers, payload, source)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::text::jsonb, $12, $13)
on conflict (scope, message_id, reason, (coalesce(fingerprint, ''::bytea))) where redriven_at is null do nothing
returning id;

-- name: dead_letter_live_id
-- The live (not re-driven) dead letter of (scope $1, message ID $2) for
-- reason $3 and fingerprint $4: what a final failure mark run again answers.
select id from {{.dead_letters}}
where scope = $1 and message_id = $2 and reason = $3 and coalesce(fingerprint, ''::bytea) = coalesce($4::bytea, ''::bytea)
  and redriven_at is null;
