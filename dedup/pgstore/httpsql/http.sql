-- HTTP Idempotency-Key requests (http.go, package httpidem): the statements
-- on the stored-response table (migration 006). Loaded by name
-- (internal/namedsql); {{.records}} and {{.http_responses}} are the store's
-- quoted, schema-qualified tables.

-- name: http_lock_timeout
-- How long the key lock (http_key_lock) waits for a concurrent request with
-- the same key, local to the transaction. $1 the timeout, e.g. '250ms' (a
-- literal: the statement runs with BEGIN, in its simple-protocol round
-- trip). A wait that runs out fails with SQLSTATE 55P03
-- (lock_not_available): the request is in flight elsewhere.
select set_config('lock_timeout', $1, true);

-- name: http_key_lock
-- One request per key at a time: a transaction-level advisory lock on $1,
-- 64 bits of SHA-256 over the records table, the scope and the message ID
-- (advisory locks are database-wide: another schema's same key is another
-- lock), taken before
-- the claim and held until COMMIT or ROLLBACK. Waits at most the
-- transaction's lock_timeout (http_lock_timeout); it is the only statement
-- that runs under it, so an unrelated lock wait (a relation extension
-- under load) never passes for a request in flight.
select pg_advisory_xact_lock($1);

-- name: http_key_try_lock
-- http_key_lock without waiting (Config.InFlightWait 0): false when another
-- transaction holds the key.
select pg_try_advisory_xact_lock($1);

-- name: http_lock_timeout_reset
-- The claim and the handler run with the session's own lock_timeout.
set local lock_timeout to default;

-- name: http_unfinished_count
-- How many unfinished records (retryable, touched within the retry window)
-- principal $1 has, counting at most $3: one scan of the partial index,
-- sent with the key's lock (its answer is used when the claim finds the key
-- new).
-- $2 the retry window in seconds.
select count(*) from (
  select 1 from {{.http_responses}}
  where principal = $1 and unfinished and updated_at > now() - make_interval(secs => $2::float8)
  limit $3) u;

-- name: http_read
-- Record $1 and its stored part, read in one statement (one snapshot, so a
-- purge deleting both is seen whole or not at all): canonicalization
-- version, status, response and its sealing key ID, and whether the record
-- has a stored part (false: not written by an HTTP request, or it predates
-- its stored part; the other columns null). No row: the record is gone
-- (purged since the claim read it): the caller claims again.
select h.canon_version, h.status, h.response, coalesce(h.response_key_id, ''), h.record_id is not null
from {{.records}} r left join {{.http_responses}} h on h.record_id = r.id
where r.id = $1;

-- name: http_upsert
-- Writes the stored part of record $1 in the handler's transaction: a final
-- response (unfinished false, $5 status, $6 response, $7 key ID), or a
-- retryable failure (unfinished true, nulls). $2 principal, $3
-- canonicalization version (kept from the first write: the record's
-- fingerprint keeps its version), $4 unfinished.
insert into {{.http_responses}} as h
  (record_id, principal, canon_version, unfinished, status, response, response_key_id, updated_at)
values ($1, $2, $3, $4, $5, $6, $7, now())
on conflict (record_id) do update
set unfinished = excluded.unfinished, status = excluded.status, response = excluded.response,
    response_key_id = excluded.response_key_id, updated_at = now();

-- name: http_record_id
-- The id of the record of (scope $1, message ID $2).
select id from {{.records}} where scope = $1 and message_id = $2;

-- name: http_stored_by_identity
-- The record of (scope $1, message ID $2) with its stored part (nulls when
-- it has none yet): lease mode reads the canonicalization version before
-- its claim, and the stored response of a duplicate.
select r.status, h.canon_version, h.status, h.response, coalesce(h.response_key_id, '')
from {{.records}} r left join {{.http_responses}} h on h.record_id = r.id
where r.scope = $1 and r.message_id = $2;

-- name: http_upsert_leased
-- http_upsert for a lease-mode owner: written only while the record is
-- PROCESSING under this owner's token $9 and fence $10 (a stale owner
-- writes nothing and gets no row). $1 scope, $2 message ID, then as
-- http_upsert from the principal on.
insert into {{.http_responses}} as h
  (record_id, principal, canon_version, unfinished, status, response, response_key_id, updated_at)
select r.id, $3, $4, $5, $6, $7, $8, now()
from {{.records}} r
where r.scope = $1 and r.message_id = $2 and r.owner_token = $9 and r.fence = $10 and r.status = 'PROCESSING'
on conflict (record_id) do update
set unfinished = excluded.unfinished, status = excluded.status, response = excluded.response,
    response_key_id = excluded.response_key_id, updated_at = now()
returning record_id;
