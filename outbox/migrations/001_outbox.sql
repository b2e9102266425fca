-- Outbox rows: messages written in the handler's transaction, published by
-- the relay (docs/architecture.md). seq orders rows (database-assigned, so independent of
-- application clocks); id is the UUIDv7 message ID published as message-id.
create table if not exists {{.outbox}} (
  seq             bigint generated always as identity primary key,
  id              uuid        not null,
  topic           text        not null,
  key             bytea,
  headers         jsonb       not null default '{}',
  payload         bytea,
  causation_id    text        not null default '',
  created_at      timestamptz not null default now(),
  available_at    timestamptz not null default now(),
  attempts        integer     not null default 0,
  last_error      text,
  last_attempt_at timestamptz,
  parked_at       timestamptz,
  published_at    timestamptz,
  published_by    text
);

create unique index if not exists {{.outbox_id_key}}
  on {{.outbox}} (id);
-- The relay's window: the oldest unpublished rows.
create index if not exists {{.outbox_pending_idx}}
  on {{.outbox}} (seq) where published_at is null;
-- Per-key order ("is there an earlier unpublished row of this key?") and the
-- relay's walk over keys (the first entry of each key is its head).
create index if not exists {{.outbox_key_idx}}
  on {{.outbox}} (topic, key, seq) where published_at is null;
-- Rows without a key, which have no order, in seq order.
create index if not exists {{.outbox_keyless_idx}}
  on {{.outbox}} (seq) where published_at is null and key is null;
-- Retention purge of published rows.
create index if not exists {{.outbox_published_idx}}
  on {{.outbox}} (published_at) where published_at is not null;
