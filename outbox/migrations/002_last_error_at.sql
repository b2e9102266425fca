-- When the most recent failed publish happened. last_error is kept after a
-- row finally publishes, as history; with last_error_at an operator tells
-- "failed before, published since" (published_at set, last_error set) from
-- "failing now" (published_at null, last_error set) and sees when it failed.
alter table {{.outbox}} add column if not exists last_error_at timestamptz;

-- Unpublished rows that failed before this migration: their last attempt
-- was that failure. (Published rows keep last_error_at null: the time of
-- their failure was not recorded.)
update {{.outbox}} set last_error_at = last_attempt_at
where last_error is not null and published_at is null and last_error_at is null;
