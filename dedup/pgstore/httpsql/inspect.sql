-- The stored part of an HTTP request's record, for operators (http_inspect.go,
-- `idemq inspect`). Loaded by name (internal/namedsql) with http.sql.

-- name: http_inspect
-- The stored-response row of the record of (scope $1, message ID $2, the key
-- as stored). No row: no such record, or it has no stored part (it was not
-- written by an HTTP request).
select h.principal, h.canon_version, h.unfinished, h.status, h.response, h.response_key_id, h.updated_at
from {{.records}} r join {{.http_responses}} h on h.record_id = r.id
where r.scope = $1 and r.message_id = $2;
