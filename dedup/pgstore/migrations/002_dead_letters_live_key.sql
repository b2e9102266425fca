-- One live dead letter per identity, reason and payload: a redelivered poison
-- message or conflict does not pile up rows.
--
-- The payload fingerprint is NULL when a dead letter has none; two NULLs must
-- count as equal here. Postgres 15 says so with NULLS NOT DISTINCT, which
-- Postgres 13 and 14 lack, so the key indexes coalesce(fingerprint, '') instead:
-- a fingerprint is 32 bytes (HMAC-SHA256) or NULL, never empty, so no two
-- different rows become equal. A database created by the release candidate's
-- first migration (which used NULLS NOT DISTINCT) gets the portable index here.
drop index if exists {{.dead_letters_live_key}};
create unique index {{.dead_letters_live_key}}
  on {{.dead_letters}} (scope, message_id, reason, (coalesce(fingerprint, ''::bytea)))
  where redriven_at is null;
