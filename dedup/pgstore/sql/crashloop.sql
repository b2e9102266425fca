-- Crash-loop limits (crashloop.go): lane watermarks and start markers.
-- {{.lane_watermarks}} is "<Schema>"."<RecordsTable>_lane_watermarks".

-- name: lane_watermark_advance
-- prev is read from the statement's snapshot: a concurrent writer of the
-- same lane (two owners during a rebalance) may be missed, never invented.
with prev as (select offset_hwm from {{.lane_watermarks}} where scope = $1 and lane = $2)
insert into {{.lane_watermarks}} as w (scope, lane, offset_hwm) values ($1, $2, $3)
on conflict (scope, lane) do update set offset_hwm = greatest(w.offset_hwm, excluded.offset_hwm), updated_at = now()
returning coalesce((select offset_hwm from prev), -1);

-- name: replay_peek
select message_id, fingerprint, fingerprint_key_id, status, attempts
from {{.records}}
where id = ({{template "record_match" .}});

-- name: start_mark_insert
-- A new identity gets a FAILED_RETRYABLE record with no attempt yet: the
-- claim of the run that follows finds it and counts the attempt (1).
insert into {{.records}}
  (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, source, reconsume_times, start_mark)
values ($1, $2, $3, $4, $5, 'FAILED_RETRYABLE', 0, $6, $7, 0)
on conflict do nothing
returning id;

-- name: start_mark_lock
select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, start_mark
from {{.records}}
where id = ({{template "record_match" .}})
for update;

-- name: start_mark_set
-- $1 record id, $2 attempts (and start mark); $3, $4: the error of a run
-- found dead (null: keep the last error).
update {{.records}}
set attempts = $2, start_mark = $2, last_error = coalesce($3, last_error), last_error_class = coalesce($4, last_error_class),
    updated_at = now()
where id = $1;

-- name: start_mark_clear
update {{.records}}
set start_mark = null
where id = $1 and start_mark = $2 and attempts = $2 and status = 'FAILED_RETRYABLE';

-- name: record_exhaust_lost
-- A record whose last execution never reported an outcome becomes
-- FAILED_FINAL: $1 record id, $2 attempts, $3 error, $4 its class, $5
-- seconds to expiry, $6 source, $7 reconsume times, $8 the owner token of
-- the lease claim that ends it (null outside lease mode).
update {{.records}}
set status = 'FAILED_FINAL', attempts = $2, last_error = $3, last_error_class = $4, owner_token = $8::uuid, lease_until = null,
    start_mark = null, source = $6, reconsume_times = $7, updated_at = now(),
    expires_at = now() + make_interval(secs => $5::float8)
where id = $1;
