-- Consumption records: one row per (scope, message ID); see docs/architecture.md.
create table if not exists {{.records}} (
  id                 bigint generated always as identity primary key,
  scope              text        not null,
  message_id         text        not null,
  business_key       text        not null default '',
  fingerprint        bytea       not null,
  fingerprint_key_id text        not null,
  status             text        not null
    check (status in ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL')),
  attempts           integer     not null default 0,
  last_error         text,
  last_error_class   text,
  owner_token        uuid,
  fence              bigint      not null default 0,
  lease_until        timestamptz,
  source             text        not null default '',
  reconsume_times    integer     not null default 0,
  result             bytea,
  created_at         timestamptz not null default now(),
  updated_at         timestamptz not null default now(),
  expires_at         timestamptz
);

create unique index if not exists {{.records_message_id_key}}
  on {{.records}} (scope, message_id);
create unique index if not exists {{.records_business_key_key}}
  on {{.records}} (scope, business_key) where business_key <> '';
create index if not exists {{.records_expires_idx}}
  on {{.records}} (expires_at) where expires_at is not null;

-- Dead letters: what could not be applied, kept whole for inspection and re-drive (docs/operations.md).
create table if not exists {{.dead_letters}} (
  id                 bigint generated always as identity primary key,
  scope              text        not null,
  message_id         text        not null,
  business_key       text        not null default '',
  reason             text        not null,
  error              text        not null default '',
  error_class        text        not null default '',
  fingerprint        bytea,
  attempts           integer     not null default 0,
  topic              text        not null default '',
  message_key        bytea,
  headers            jsonb       not null default '{}',
  payload            bytea,
  source             text        not null default '',
  created_at         timestamptz not null default now(),
  redriven_at        timestamptz
);

-- The unique index on live dead letters (one per identity, reason and
-- payload) is created by 002_dead_letters_live_key.sql.
create index if not exists {{.dead_letters_created_idx}}
  on {{.dead_letters}} (scope, created_at);
