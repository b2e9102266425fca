-- Placeholder for migration 5, which belongs to the records/dead-letter index
-- work (branch roofline-index, 005_*.sql). It does nothing; it exists only so
-- that 006 can apply on a branch without that migration (tern refuses gaps).
-- When both branches are merged, delete this file and keep theirs.
select 1;
