package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultStatementTimeout is Config.StatementTimeout's default: the longest
// one of idemq's own steps on Postgres waits for the server.
const DefaultStatementTimeout = 30 * time.Second

// bound returns ctx with StatementTimeout as its deadline (or ctx's own,
// when sooner), for one of idemq's own steps.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.StatementTimeout)
}

// detach returns a context that keeps ctx's values but not its
// cancellation, bounded by StatementTimeout: for the writes that must land
// even when the caller's context has ended (a shutdown), and must still not
// wait for ever on a connection that stopped answering.
func (s *Store) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.cfg.StatementTimeout)
}

// rollback rolls tx back on a detached, bounded context (see detach).
func (s *Store) rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := s.detach(ctx)
	_ = tx.Rollback(rctx)
	cancel()
}
