-- Dead-letter tooling (deadletters.go): the statements with a fixed shape.
-- ScanDeadLetters, CountDeadLetters and the pages of RedriveDeadLetters are
-- built in Go from the filter (deadLetterWhere), with the filter's values as
-- parameters, so each runs with only the conditions it needs and the planner
-- can use the (scope, id) index of migration 007.

-- name: dead_letters_bound
-- The highest dead letter id when a re-drive starts: it walks no further
-- (dead letters written meanwhile are left to the next re-drive).
select coalesce(max(id), 0) from {{.dead_letters}};

-- name: dead_letters_redrive_step
-- One step of RedriveDeadLetters: $1 are the ids of the page's dead letters
-- that may be re-driven in place (not conflicts, not re-driven when the page
-- was read). A dead letter's record is the one of its message ID, or of its
-- business key (a copy under another message ID that matched the record by
-- business key and failed it is dead-lettered under its own message ID).
-- Their records that are still FAILED_FINAL are locked in id order, FOR UPDATE SKIP LOCKED: a record another re-drive (or a consumer's
-- claim) holds right now is left to it, so two re-drives at once never both
-- release one record and never wait on each other; the lock also re-checks
-- the status on the latest version (a record released by a re-drive that
-- committed after this statement's snapshot is no longer FAILED_FINAL and
-- drops out). The locked records become FAILED_RETRYABLE as Redrive makes
-- them, and every live dead letter of their identities is stamped
-- redriven_at, so a second run finds them re-driven. Returns the records
-- released and the dead letters stamped.
with keys as (
  select distinct scope, message_id, business_key from {{.dead_letters}}
  where id = any($1::bigint[]) and redriven_at is null),
rec as (
  select r.id from {{.records}} r
  join keys k on r.scope = k.scope
    and (r.message_id = k.message_id or (k.business_key <> '' and r.business_key = k.business_key))
  where r.status = 'FAILED_FINAL'
  order by r.id
  for update of r skip locked),
up as (
  update {{.records}} r set status = 'FAILED_RETRYABLE', expires_at = null, updated_at = now()
  from rec where r.id = rec.id
  returning r.scope, r.message_id, r.business_key),
st as (
  -- The live dead letters of the released records: by message ID (all, as
  -- Redrive stamps them), and by business key those of their own failures
  -- (a payload conflict of the business key stays live for RedriveAsNew).
  update {{.dead_letters}} d set redriven_at = now()
  from up where d.scope = up.scope and d.redriven_at is null
    and (d.message_id = up.message_id
      or (up.business_key <> '' and d.business_key = up.business_key
          and d.reason in ('attempts_exhausted', 'permanent_error', 'bad_input')))
  returning 1)
select (select count(*) from up)::bigint, (select count(*) from st)::bigint;

-- name: dead_letters_redrive_dry
-- A dry run's step: of the dead letters $1 (as dead_letters_redrive_step),
-- how many distinct records are FAILED_FINAL now, so would be released.
select count(distinct r.id)::bigint from {{.dead_letters}} d
join {{.records}} r on r.scope = d.scope
  and (r.message_id = d.message_id or (d.business_key <> '' and r.business_key = d.business_key))
where d.id = any($1::bigint[]) and d.redriven_at is null and r.status = 'FAILED_FINAL';

-- name: dead_letter_share
-- RepublishDeadLetter's read of the dead letter, FOR SHARE: a purge cannot
-- delete it while the republish is written (the audit row references it).
select id, scope, message_id, business_key, reason, error, error_class, attempts,
  topic, message_key, payload, headers, source, created_at, redriven_at
from {{.dead_letters}} where id = $1 for share;

-- name: republish_insert
-- The audit mark of a republish, once per (dead letter, outbox table, topic,
-- message-ID choice): a second request, also one running at the same time
-- (it waits on the unique key until the first commits), inserts nothing and
-- reads the first row with republish_get.
insert into {{.republishes}} (dead_letter_id, outbox_table, topic, new_message_id, message_id, operator)
values ($1, $2, $3, $4, $5, $6)
on conflict (dead_letter_id, outbox_table, topic, new_message_id) do nothing
returning id;

-- name: republish_get
select message_id, coalesce(outbox_id::text, '') from {{.republishes}}
where dead_letter_id = $1 and outbox_table = $2 and topic = $3 and new_message_id = $4;

-- name: republish_set_outbox
update {{.republishes}} set outbox_id = $2::uuid where id = $1;
