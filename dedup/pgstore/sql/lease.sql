-- Lease mode (lease.go, lease_unknown.go). Every deadline is computed from
-- the database's now(), never the application clock.

-- name: lease_claim
-- The lease-mode claim, after one read as in record_claim: when a record holds either
-- unique key it comes back as read (no lock, nothing inserted), with whether
-- its lease is live; otherwise the new PROCESSING record is inserted. Always
-- one row: the new id (null when nothing was inserted), then the existing
-- record (nulls when none). $1 scope, $2 message ID, $3 business key, $4
-- fingerprint, $5 its key ID, $6 source, $7 reconsume times, $8 owner token,
-- $9 TTL in seconds.
with found as (
  select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts,
    coalesce(lease_until > now(), false) as live
  from {{.records}}
  where id = ({{template "record_match" .}})),
ins as (
  insert into {{.records}}
    (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, source, reconsume_times,
     owner_token, fence, lease_until)
  select $1::text, $2::text, $3::text, $4::bytea, $5::text, 'PROCESSING', 1, $6::text, $7::integer, $8::uuid, 1,
         now() + make_interval(secs => $9::float8)
  where not exists (select 1 from found)
  on conflict do nothing
  returning id)
select (select id from ins), f.id, f.message_id, f.business_key, f.fingerprint, f.fingerprint_key_id, f.status,
  f.attempts, f.live
from (values (1)) one (x) left join found f on true;

-- name: lease_lock
-- record_lock plus whether the record's lease is live in database time.
select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts,
  coalesce(lease_until > now(), false)
from {{.records}}
where id = ({{template "record_match" .}})
for update;

-- name: lease_take
-- $1 record id, $2 owner token, $3 TTL in seconds, $4 source, $5 reconsume
-- times.
update {{.records}}
set status = 'PROCESSING', attempts = attempts + 1, fence = fence + 1, owner_token = $2,
    lease_until = now() + make_interval(secs => $3::float8), source = $4, reconsume_times = $5, updated_at = now()
where id = $1
returning attempts, fence;

-- name: lease_beat
-- $1 record id, $2 owner token, $3 fence, $4 TTL in seconds.
update {{.records}}
set lease_until = now() + make_interval(secs => $4::float8), updated_at = now()
where id = $1 and owner_token = $2 and fence = $3 and status = 'PROCESSING';

-- The marks that end a lease (done, release, fail) return two booleans:
-- this statement made the mark, and an earlier run of the same mark (same
-- owner token and fence, the status it writes) had already made it. The
-- owner token and fence stay on the row after the lease ends, so a mark
-- retried after its answer was lost recognises its own first run (see
-- lease_unknown.go). The second EXISTS reads the row as it was before this
-- statement. $1 record id, $2 owner token, $3 fence.

-- name: lease_done
-- $4 seconds to expiry.
with m as (
  update {{.records}}
  set status = 'SUCCEEDED', lease_until = null, updated_at = now(),
      expires_at = now() + make_interval(secs => $4::float8)
  where id = $1 and owner_token = $2 and fence = $3 and status = 'PROCESSING'
  returning 1)
select exists (select 1 from m),
       exists (select 1 from {{.records}} where id = $1 and owner_token = $2 and fence = $3 and status = 'SUCCEEDED');

-- name: lease_release
-- Gives a lease back after a shutdown interrupted its handler: the attempt
-- is not counted, the next copy runs the handler.
with m as (
  update {{.records}}
  set status = 'FAILED_RETRYABLE', attempts = greatest(attempts - 1, 0), lease_until = null,
      updated_at = now()
  where id = $1 and owner_token = $2 and fence = $3 and status = 'PROCESSING'
  returning 1)
select exists (select 1 from m),
       exists (select 1 from {{.records}} where id = $1 and owner_token = $2 and fence = $3 and status = 'FAILED_RETRYABLE');

-- name: lease_fail
-- $4 status, $5 error, $6 its class, $7 seconds to expiry (null: never).
with m as (
  update {{.records}}
  set status = $4, last_error = $5, last_error_class = $6, lease_until = null, updated_at = now(),
      expires_at = now() + make_interval(secs => $7::float8)
  where id = $1 and owner_token = $2 and fence = $3 and status = 'PROCESSING'
  returning 1)
select exists (select 1 from m),
       exists (select 1 from {{.records}} where id = $1 and owner_token = $2 and fence = $3 and status = $4);

-- name: lease_own_claim
-- The record of ($1, $2, $3) when it is PROCESSING under one of the owner
-- tokens $4 (a claim whose answer was lost), its lease extended to $5
-- seconds from now.
update {{.records}}
set lease_until = now() + make_interval(secs => $5::float8), updated_at = now()
where id = ({{template "record_match" .}}) and owner_token = any($4::uuid[]) and status = 'PROCESSING'
returning id, message_id, business_key, owner_token, attempts, fence;

-- name: lease_own_exhaust
-- The attempts of the record of ($1, $2, $3) when it is FAILED_FINAL under
-- one of the owner tokens $4 (a claim whose answer was lost dead-lettered it).
select attempts from {{.records}}
where id = ({{template "record_match" .}}) and owner_token = any($4::uuid[]) and status = 'FAILED_FINAL';
