package pgstore

import (
	"errors"

	"github.com/idemq/idemq/internal/pooler"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNeedsSession is returned by Migrate and RunMaintenance when
// Config.TransactionPooler is set: they hold session advisory locks, which
// a transaction pooler does not keep. Run them on a Store built on a direct
// pool. outbox.ErrNeedsSession is the same error.
var ErrNeedsSession = pooler.ErrNeedsSession

// IsUniqueViolation reports whether err holds a Postgres unique violation
// (SQLSTATE 23505); constraint, when not empty, must also match.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && (constraint == "" || pgErr.ConstraintName == constraint)
}
