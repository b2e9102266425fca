-- Reserved. Migration 003 is taken by a change developed in parallel (the
-- crash-loop start marker of issue 8); this placeholder only keeps the
-- numbers contiguous, which the migrator requires, until that change lands
-- and replaces it. It changes nothing.
select 1;
