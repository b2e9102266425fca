-- HTTP Idempotency-Key requests (package httpidem): the part of a request's
-- consumption record that MQ deliveries do not have. One row per record of an
-- HTTP request, keyed by the record's id; ON DELETE CASCADE, so purging the
-- record (Store.Purge, `idemq purge`) removes it.
--
-- principal       tenant and principal (escaped, hashed when long): the key of
--                 the cap on unfinished keys (httpidem Config.MaxUnfinished)
-- canon_version   version of the body canonicalization the record's
--                 fingerprint was made with; a retry is compared under it
-- unfinished      true while the record may run the handler again
--                 (FAILED_RETRYABLE): what the cap counts, through the
--                 partial index below (it holds unfinished rows only)
-- status          the stored final response's HTTP status (null: none yet)
-- response        the stored response (httpidem's encoding, possibly sealed)
-- response_key_id the sealing key's ID ('' = not sealed)
create table if not exists {{.http_responses}} (
  record_id        bigint      primary key references {{.records}} (id) on delete cascade,
  principal        text        not null,
  canon_version    integer     not null,
  unfinished       boolean     not null,
  status           integer,
  response         bytea,
  response_key_id  text        not null default '',
  updated_at       timestamptz not null default now()
);

create index if not exists {{.http_responses_unfinished_idx}}
  on {{.http_responses}} (principal, updated_at) where unfinished;
