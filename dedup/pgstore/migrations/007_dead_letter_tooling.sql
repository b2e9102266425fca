-- Dead-letter tooling (Store.ScanDeadLetters, CountDeadLetters,
-- RedriveDeadLetters, RepublishDeadLetter; `idemq dead-letters …`).
--
-- (scope, id): a scope's dead letters in id order, the keyset walk of
-- ScanDeadLetters and RedriveDeadLetters with a scope (the (scope,
-- created_at) index would have to sort a scope's whole range for each page).
-- Building it locks writes to the dead-letter table for the build (no
-- CONCURRENTLY inside a migration's transaction); on a very large table,
-- create it first with `create index concurrently if not exists
-- "<dead letters>_scope_id_idx" on … (scope, id)` and this statement finds it.
create index if not exists {{.dead_letters_scope_id_idx}}
  on {{.dead_letters}} (scope, id);

-- Republishes of dead letters through an outbox (Store.RepublishDeadLetter):
-- the audit mark that makes a republish happen once per dead letter,
-- destination (outbox table and topic) and message-ID choice. The row is
-- written in the same transaction as the outbox row; a second request finds
-- it (the unique key) and adds no outbox row. Deleted with its dead letter
-- (purge).
create table if not exists {{.republishes}} (
  id              bigint generated always as identity primary key,
  dead_letter_id  bigint      not null references {{.dead_letters}} (id) on delete cascade,
  outbox_table    text        not null,
  topic           text        not null,
  new_message_id  boolean     not null,
  message_id      text        not null,
  outbox_id       uuid,
  operator        text        not null default '',
  created_at      timestamptz not null default now()
);

create unique index if not exists {{.republishes_key}}
  on {{.republishes}} (dead_letter_id, outbox_table, topic, new_message_id);
