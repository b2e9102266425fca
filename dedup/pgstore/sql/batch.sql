-- Set-based batched mode (batch_set.go): a whole batch is claimed in one
-- round trip, one pipeline of records_claim_set and records_lock_set. {{.records}} is the store's quoted, schema-qualified
-- record table. Each statement takes arrays, one element per message (one
-- Go slice per column, allocated once per batch).

-- fragment: records_match_set
-- The records holding (scope $1[i], message ID $2[i]) or (scope $1[i],
-- non-empty business key $3[i]), for every i: two joins on the two unique
-- indexes (never an OR, which a generic plan would answer with a scan of the
-- table), and a union so that a record matching twice comes back once.
select r.id, r.message_id, r.business_key, r.fingerprint, r.fingerprint_key_id, r.status, r.attempts, r.scope
from unnest($1::text[], $2::text[]) as k (scope, message_id)
join {{.records}} r on r.scope = k.scope and r.message_id = k.message_id
union
select r.id, r.message_id, r.business_key, r.fingerprint, r.fingerprint_key_id, r.status, r.attempts, r.scope
from unnest($1::text[], $3::text[]) as k (scope, business_key)
join {{.records}} r on r.scope = k.scope and r.business_key = k.business_key
where k.business_key <> '' and r.business_key <> ''

-- name: records_claim_set
-- Claims the batch in one statement. found: one read (the statement's
-- snapshot) of every record the batch's messages match; ins: a new record
-- for each message offered ($8) that no record found holds by either key,
-- inserted SUCCEEDED with its expiry (the batch's COMMIT decides, as in
-- atomic mode: a handler failure rolls back to its savepoint and marks the
-- record FAILED_*). A found record is never inserted against, so a copy of a
-- record that another transaction holds locked (a re-drive) does not wait
-- for it; a conflict with a record committed or being inserted meanwhile
-- inserts nothing for that message (the caller claims it on its own). Rows
-- go in (scope, message ID) order, so that two batches inserting the same
-- IDs wait for each other in one order instead of deadlocking.
-- Returns the inserted records (new = true), then the found ones.
-- $1 scopes, $2 message IDs, $3 business keys ('' = none), $4 fingerprints,
-- $5 their key IDs, $6 sources, $7 reconsume times, $8 whether to insert
-- (no two offered messages share a message ID or a non-empty business key),
-- one element per message; $9 seconds to expiry.
with found as ({{template "records_match_set" .}}),
ins as (
  insert into {{.records}} as r
    (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, source, reconsume_times, expires_at)
  select k.scope, k.message_id, k.business_key, k.fingerprint, k.key_id, 'SUCCEEDED', 1, k.source, k.reconsume_times,
         now() + make_interval(secs => $9::float8)
  from unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::integer[], $8::boolean[])
    as k (scope, message_id, business_key, fingerprint, key_id, source, reconsume_times, offered)
  where k.offered
    and not exists (select 1 from found f where f.scope = k.scope and f.message_id = k.message_id)
    and not exists (select 1 from found f where k.business_key <> '' and f.scope = k.scope and f.business_key = k.business_key)
  order by k.scope, k.message_id
  on conflict do nothing
  returning id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, scope)
select ins.*, true from ins
union all
select found.*, false from found;

-- name: records_lock_set
-- Locks the records of the batch that are not terminal (PROCESSING,
-- FAILED_RETRYABLE), in one statement and in id order, so that two batches
-- sharing records lock them in the same order (no deadlock); a record that
-- became terminal while this waited for its lock is not locked (the status
-- is checked again on the row version locked). $1 scopes, $2 message IDs,
-- $3 business keys, as records_claim_set.
select id from {{.records}}
where id in (select m.id from ({{template "records_match_set" .}}) m)
  and status in ('PROCESSING', 'FAILED_RETRYABLE')
order by id
for update;

-- name: records_unclaim_set
-- Deletes records this transaction inserted (records_claim_set) for
-- messages after the batch stopped (a message to retry first): they were
-- not attempted, and must not commit. $1 record ids.
delete from {{.records}} where id = any($1::bigint[]);
