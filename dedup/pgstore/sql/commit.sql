-- Statements that travel with COMMIT, in the same round trip (lazytx.go
-- commitWith). The server skips whatever follows a failing statement of a
-- pipeline, COMMIT included: a statement that must not let the COMMIT run
-- when it finds something wrong raises an error instead of answering.

-- name: record_mark_succeeded_at_commit
-- record_mark_succeeded for a record this transaction reclaimed: $1 record
-- id, $2 seconds to expiry. It fails (SQLSTATE 22P02, the message naming
-- how many records it marked) unless it marked exactly one PROCESSING
-- record, so that the COMMIT queued behind it does not run.
with marked as (
  update {{.records}}
  set status = 'SUCCEEDED', updated_at = now(), expires_at = now() + make_interval(secs => $2::float8)
  where id = $1 and status = 'PROCESSING'
  returning id)
select case when count(*) = 1 then 1
            else ('idemq: mark succeeded: ' || count(*) || ' records in PROCESSING')::integer end
from marked;
