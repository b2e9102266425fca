-- A caller-chosen message ID (Message.MessageID): published in the
-- message-ID header instead of the row's UUIDv7 id when not ''. Used to
-- republish a dead letter under its own message ID (or a derived one), so
-- the consumer's dedup recognises it. A column with a constant default is
-- added without rewriting the table (Postgres 11 or later).
alter table {{.outbox}} add column if not exists message_id text not null default '';
