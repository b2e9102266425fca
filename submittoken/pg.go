package submittoken

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PGConfig configures a PGStore (NewPG). The zero value of each field
// except Table means its default.
type PGConfig struct {
	// Table is the tokens' table, schema-qualified or not
	// (pgx.Identifier{"shop", "submit_tokens"}); required, 1 to 3 parts,
	// each 1 to 63 bytes of UTF-8 without NUL. PGStore.CreateTable creates
	// it.
	Table pgx.Identifier
	// TTL is how long an issued token can be consumed. Default DefaultTTL
	// (30 minutes); MinTTL (1s) to MaxTTL (7 days).
	TTL time.Duration
	// UsedTTL is how long past a token's expiry Purge keeps its row, so a
	// used token is answered ErrTokenUsed (not ErrTokenUnknown) for at
	// least that long after its use. Default DefaultUsedTTL (10 minutes);
	// MinTTL (1s) to MaxTTL (7 days).
	UsedTTL time.Duration
}

// PGDB runs PGStore's statements: a pgx.Tx, *pgx.Conn, *pgxpool.Pool or
// *pgxpool.Conn.
type PGDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PGStore issues and consumes one-time submit tokens as rows of a Postgres
// table, so that a token is consumed in the transaction that does the
// submit's work (the one httpidem.FromContext returns): it is consumed
// when that transaction commits, and is still unused when it rolls back
// (a retryable failure, a panic, a crash), ready for the retry. Two
// submits at once serialize on the token's row: the second waits for the
// first transaction and then finds the token used, or, when the first
// rolled back, consumes it. Only the token's SHA-256 is stored. Safe for
// concurrent use.
type PGStore struct {
	cfg                               PGConfig
	create, insert, consume, diagnose string
	purge                             string
}

// NewPG returns a PGStore for cfg (defaults applied), or an error wrapping
// ErrInvalidConfig that names the invalid field. It runs no statement.
func NewPG(cfg PGConfig) (*PGStore, error) {
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.UsedTTL == 0 {
		cfg.UsedTTL = DefaultUsedTTL
	}
	switch {
	case len(cfg.Table) == 0 || len(cfg.Table) > 3:
		return nil, fmt.Errorf("%w: Table must have 1 to 3 parts, has %d", ErrInvalidConfig, len(cfg.Table))
	case cfg.TTL < MinTTL || cfg.TTL > MaxTTL:
		return nil, fmt.Errorf("%w: TTL %s must be from %s to %s", ErrInvalidConfig, cfg.TTL, MinTTL, MaxTTL)
	case cfg.UsedTTL < MinTTL || cfg.UsedTTL > MaxTTL:
		return nil, fmt.Errorf("%w: UsedTTL %s must be from %s to %s", ErrInvalidConfig, cfg.UsedTTL, MinTTL, MaxTTL)
	}
	for i, p := range cfg.Table {
		if p == "" || len(p) > 63 || !validIdent(p) {
			return nil, fmt.Errorf("%w: Table[%d] %q must be 1 to 63 bytes of UTF-8 without NUL", ErrInvalidConfig, i, p)
		}
	}
	t := cfg.Table.Sanitize()
	idx := pgx.Identifier{cfg.Table[len(cfg.Table)-1] + "_expires_at"}.Sanitize()
	return &PGStore{
		cfg: cfg,
		create: `CREATE TABLE IF NOT EXISTS ` + t + ` (
  scope      text        NOT NULL,
  token_hash bytea       NOT NULL,
  expires_at timestamptz NOT NULL,
  used_at    timestamptz,
  PRIMARY KEY (scope, token_hash));
CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + t + ` (expires_at)`,
		insert:   `INSERT INTO ` + t + ` (scope, token_hash, expires_at) VALUES ($1, $2, now() + make_interval(secs => $3)) ON CONFLICT DO NOTHING`,
		consume:  `UPDATE ` + t + ` SET used_at = now() WHERE scope = $1 AND token_hash = $2 AND used_at IS NULL AND expires_at > now()`,
		diagnose: `SELECT used_at IS NOT NULL FROM ` + t + ` WHERE scope = $1 AND token_hash = $2`,
		purge: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + t +
			` WHERE expires_at < now() - make_interval(secs => $1) LIMIT $2))`,
	}, nil
}

// Config returns the PGStore's configuration with the defaults applied.
func (s *PGStore) Config() PGConfig { return s.cfg }

// CreateTable creates the table and its index on expires_at when they do
// not exist (CREATE … IF NOT EXISTS): scope text, token_hash bytea (the
// token's SHA-256), expires_at, used_at, primary key (scope, token_hash).
func (s *PGStore) CreateTable(ctx context.Context, db PGDB) error {
	if _, err := db.Exec(ctx, s.create); err != nil {
		return fmt.Errorf("submittoken: create table: %w", err)
	}
	return nil
}

// Issue returns a fresh token for scope, valid for Config.TTL (database
// time), inserted on db. Errors: ErrInvalidScope, a crypto/rand failure, or
// the database's error (wrapped).
func (s *PGStore) Issue(ctx context.Context, db PGDB, scope string) (string, error) {
	return issue(scope, func(token string) (bool, error) {
		tag, err := db.Exec(ctx, s.insert, scope, tokenHash(token), s.cfg.TTL.Seconds())
		return tag.RowsAffected() == 1, err
	})
}

// Consume uses token in scope, on db: call it with the transaction of the
// submit's work, so the token is used when that transaction commits and
// unused again when it rolls back. nil: consumed by this transaction (go
// on); ErrTokenUsed: a committed (or concurrent, then committed)
// transaction consumed it; ErrTokenUnknown: never issued in scope,
// expired, purged or malformed (refused without a statement);
// ErrInvalidScope; or the database's error, wrapped (in a pgx.Tx, a failed
// statement aborts the transaction); a nil db is an error too (the
// httpidem middleware's lease mode has no transaction: use
// Store.ConsumeFor there). One UPDATE, and a SELECT when it changed
// nothing.
func (s *PGStore) Consume(ctx context.Context, db PGDB, scope, token string) error {
	if err := checkScope(scope); err != nil {
		return err
	}
	if !wellFormed(token) {
		return ErrTokenUnknown
	}
	if db == nil {
		return errors.New("submittoken: consume: no transaction (httpidem.FromContext is nil in lease mode: use Store.ConsumeFor there)")
	}
	h := tokenHash(token)
	tag, err := db.Exec(ctx, s.consume, scope, h)
	if err != nil {
		return fmt.Errorf("submittoken: consume: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var used bool
	switch err := db.QueryRow(ctx, s.diagnose, scope, h).Scan(&used); {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrTokenUnknown
	case err != nil:
		return fmt.Errorf("submittoken: consume: %w", err)
	case used:
		return ErrTokenUsed
	}
	return ErrTokenUnknown // issued, unused, expired
}

// Purge deletes at most limit rows whose token expired more than
// Config.UsedTTL ago, used or not, and returns how many it deleted. Run it
// periodically (a loop until it returns less than limit); the index on
// expires_at keeps each call to the rows it deletes.
func (s *PGStore) Purge(ctx context.Context, db PGDB, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("submittoken: purge: limit %d must be positive", limit)
	}
	tag, err := db.Exec(ctx, s.purge, s.cfg.UsedTTL.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("submittoken: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}

func tokenHash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// validIdent reports whether s is UTF-8 without NUL.
func validIdent(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
