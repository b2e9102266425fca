-- The operator's statements (admin.go, redrive.go). {{.redrives}} is the
-- audit table of RedriveAsNew, "<Schema>"."<DeadLettersTable>_redrives".

-- fragment: record_columns
scope, message_id, business_key, fingerprint, fingerprint_key_id, status,
  attempts, last_error, last_error_class, fence, source, reconsume_times, created_at, updated_at, expires_at

-- name: lookup_by_message_id
select {{template "record_columns"}}
from {{.records}} where scope = $1 and message_id = $2 and message_id <> '';

-- name: lookup_by_business_key
select {{template "record_columns"}}
from {{.records}} where scope = $1 and business_key = $2 and business_key <> '';

-- name: dead_letters_list
-- $1 scope, $2 after this dead letter id, $3 limit.
select d.id, d.scope, d.message_id, d.business_key, d.reason, d.error, d.error_class,
  d.attempts, d.topic, d.message_key, d.payload, d.headers, d.source, d.created_at, d.redriven_at,
  coalesce(r.new_message_id, '')
from {{.dead_letters}} d left join {{.redrives}} r on r.dead_letter_id = d.id
where d.scope = $1 and d.id > $2 order by d.id limit $3;

-- name: dead_letters_prefix
-- dead_letters_list over every scope that starts with $1 (e.g. 'http|', the
-- scopes of HTTP requests): a walk of the primary key from $2 that skips the
-- other scopes' rows (an operator's listing, not a hot path).
select d.id, d.scope, d.message_id, d.business_key, d.reason, d.error, d.error_class,
  d.attempts, d.topic, d.message_key, d.payload, d.headers, d.source, d.created_at, d.redriven_at,
  coalesce(r.new_message_id, '')
from {{.dead_letters}} d left join {{.redrives}} r on r.dead_letter_id = d.id
where starts_with(d.scope, $1) and d.id > $2 order by d.id limit $3;

-- name: redrive_record
update {{.records}}
set status = 'FAILED_RETRYABLE', expires_at = null, updated_at = now()
where scope = $1 and message_id = $2 and status = 'FAILED_FINAL';

-- name: redrive_record_status
select status from {{.records}} where scope = $1 and message_id = $2;

-- name: redrive_dead_letters
update {{.dead_letters}} set redriven_at = now()
where scope = $1 and message_id = $2 and redriven_at is null;

-- name: purge_bound
-- The highest record id when a purge starts: it walks no further (records
-- inserted while it runs are left to the next purge).
select coalesce(max(id), 0) from {{.records}};

-- name: purge
-- One step of Store.Purge's walk: the next $2 records after id $1 (up to id
-- $3), in primary-key order, and of those the expired ones deleted: one
-- index scan of the primary key to find the step, one range scan of it for
-- the DELETE. No index on expires_at: the primary key serves the walk, and
-- updates of a record stay HOT (migrations/005_records_hot_updates.sql).
-- The DELETE waits for a row another transaction holds locked and checks
-- expires_at again on its latest version, so a record re-driven meanwhile
-- (expires_at null) stays, and one that a concurrent purge deleted is
-- skipped. (Locking the rows first with FOR UPDATE SKIP LOCKED, as the
-- purge of migrations 001 to 004 did, writes each row twice: measured, it
-- halves the purge's rate.) Returns the last id walked (null: nothing
-- left), how many records were deleted, and whether every record of the
-- step was created less than $4 seconds (the purging store's
-- SucceededRetention) ago: such records cannot have expired yet, so a step
-- like that which deleted nothing is the expiry frontier, where the walk
-- stops.
with step as materialized (
  select id, created_at > now() - make_interval(secs => $4::float8) as young
  from {{.records}} where id > $1 and id <= $3 order by id limit $2),
gone as (
  delete from {{.records}} where id > $1 and id <= (select max(id) from step) and expires_at < now()
  returning 1)
select max(id), (select count(*) from gone), coalesce(bool_and(young), false) from step;

-- name: dead_letter_lock
-- FOR UPDATE serializes two operators re-driving the same dead letter.
select id, scope, message_id, business_key, reason, error, error_class, attempts,
  topic, message_key, payload, headers, source, created_at, redriven_at
from {{.dead_letters}} where id = $1 and scope = $2 for update;

-- name: business_key_holder
select message_id from {{.records}} where scope = $1 and business_key = $2 and business_key <> '';

-- name: redrive_audit_insert
insert into {{.redrives}}
  (dead_letter_id, scope, message_id, new_message_id, business_key, reason, forced, operator)
values ($1, $2, $3, $4, $5, $6, $7, $8)
on conflict (dead_letter_id) do nothing
returning id, created_at;

-- name: redrive_audit_get
select id, new_message_id, created_at, published_at from {{.redrives}} where dead_letter_id = $1;

-- name: redrive_audit_published
update {{.redrives}} set published_at = coalesce(published_at, now())
where id = $1 returning published_at;
