-- The stored part of an HTTP request's record, for operators (http_inspect.go,
-- `idemq inspect`). Loaded by name (internal/namedsql) with http.sql.

-- name: http_inspect
-- The record of (scope $1, message ID $2, the key as stored) with its
-- stored-response row, in one statement (one snapshot: a purge deleting
-- both is seen whole or not at all). The stored part's columns are null
-- when the record has none (it was not written by an HTTP request). No
-- row: no such record.
select r.scope, r.message_id, r.business_key, r.fingerprint, r.fingerprint_key_id, r.status,
  r.attempts, r.last_error, r.last_error_class, r.fence, r.source, r.reconsume_times, r.created_at,
  r.updated_at, r.expires_at,
  h.record_id is not null, h.principal, h.canon_version, h.unfinished, h.status, h.response,
  h.response_key_id, h.updated_at
from {{.records}} r left join {{.http_responses}} h on h.record_id = r.id
where r.scope = $1 and r.message_id = $2 and r.message_id <> '';
