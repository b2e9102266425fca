-- Record updates stay HOT; purge walks the primary key (docs/operations.md,
-- "Purge cost and indexes").
--
-- A mark (PROCESSING → SUCCEEDED, → FAILED_FINAL, a re-drive) writes
-- expires_at. While expires_at was indexed, no such update could be HOT
-- (heap-only: the new row version on the same page, no index entry written):
-- each one wrote a new entry into every index of the table. Without it, the
-- indexed columns (id, scope, message_id, business_key) never change after
-- the insert, so every update of a record is HOT when its page has room.
--
-- A BRIN index on expires_at would block HOT as well before PostgreSQL 16
-- (13 to 15 count every indexed column), and it loses its selectivity once
-- purged pages are refilled; Store.Purge now walks the records in id order
-- instead (sql/admin.sql, purge), which the primary key serves.
--
-- fillfactor 90 leaves a tenth of each page, filled by inserts, for the
-- updated versions of its records. It applies to pages filled from now on;
-- existing pages are not rewritten.
--
-- Both statements change the catalog only: on a populated table they take
-- milliseconds (35 ms with the commit on 1 M records, measured on
-- PostgreSQL 15), no rewrite and no index build, so nothing here needs
-- CONCURRENTLY (which could not run in the migration's transaction).
-- DROP INDEX takes the table's ACCESS EXCLUSIVE lock for that moment; the
-- lock_timeout makes the migration fail (and leave the schema at 004, to be
-- run again) rather than queue behind a long transaction on the table while
-- every claim queues behind it.
set local lock_timeout = '10s';

drop index if exists {{.schema}}.{{.records_expires_idx}};

alter table {{.records}} set (fillfactor = 90);
