// Package pooler holds the checks idemq makes when its pool reaches Postgres
// through a connection pooler in transaction mode (PgBouncer pool_mode =
// transaction, RDS Proxy, Supavisor's transaction mode): a client keeps one
// server session only for the length of a transaction.
package pooler

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNeedsSession is returned by the operations that need one server
// session across transactions (session advisory locks, LISTEN) when the
// configuration says the pool is behind a transaction pooler.
var ErrNeedsSession = errors.New("needs a server session, which a transaction pooler does not keep")

// CheckExecMode refuses a pool whose connections prepare statements in a
// way a transaction pooler breaks: QueryExecModeCacheStatement (named
// prepared statements live on one server session) and
// QueryExecModeDescribeExec (Describe and Execute are two round trips,
// which the pooler may send to two server sessions). QueryExecModeExec,
// QueryExecModeSimpleProtocol and QueryExecModeCacheDescribe pass. field
// names the setting in the error ("pgstore.Config.TransactionPooler").
func CheckExecMode(pool *pgxpool.Pool, field string, invalid error) error {
	if pool == nil {
		return nil
	}
	switch m := pool.Config().ConnConfig.DefaultQueryExecMode; m {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec:
		return fmt.Errorf("%w: %s is set but the pool's DefaultQueryExecMode is %s, which a transaction pooler breaks: "+
			"use pgx.QueryExecModeExec or pgx.QueryExecModeSimpleProtocol (connection string: default_query_exec_mode=exec "+
			"or simple_protocol)", invalid, field, m)
	}
	return nil
}

// NeedsSession is the error of an operation (what) that needs a server
// session when field is set; fix says what to do instead.
func NeedsSession(what, field, fix string) error {
	return fmt.Errorf("%s: %w (%s is set): %s", what, ErrNeedsSession, field, fix)
}
