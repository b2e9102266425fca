package transition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

var (
	// ErrIllegalTransition is matched (errors.Is) by the error of an Apply
	// whose row is in a status the rules do not allow `to` from, which is
	// not `to` already and which `to` has not been passed on the way to
	// (Machine.Passed). The error is an *IllegalTransitionError.
	ErrIllegalTransition = errors.New("transition: illegal transition")
	// ErrStaleVersion is matched by the error of an Apply with IfVersion
	// whose row has another version: it changed since the caller read it.
	// The error is a *StaleVersionError.
	ErrStaleVersion = errors.New("transition: stale version")
	// ErrNotFound is returned by Apply when no row has the id.
	ErrNotFound = errors.New("transition: no such row")
	// ErrUnknownState is returned by Apply for a `to` that no rule leads
	// to: a programming error, refused before any statement.
	ErrUnknownState = errors.New("transition: no rule leads to this status")
)

// IllegalTransitionError is the error of an illegal transition.
type IllegalTransitionError struct {
	Entity  string // Config.Entity
	ID      any    // Apply's id
	Status  string // the row's current status
	Version int64  // the row's current version
	To      string // the status asked for
	// Reachable is true when the rules still lead from Status to To in
	// more than one step (Machine.Reachable): the request came early or
	// out of order, and may succeed once the missing steps are applied.
	// False: the row can never reach To from Status, and retrying cannot
	// help (Permanent).
	Reachable bool
}

// Permanent reports whether retrying cannot help: the rules never lead
// from Status to To (Reachable is false). idemq's consumer reads it
// (dedup.IsPermanent): such a message is dead-lettered at its first
// attempt instead of after the store's MaxAttempts.
func (e *IllegalTransitionError) Permanent() bool { return !e.Reachable }

func (e *IllegalTransitionError) Error() string {
	return fmt.Sprintf("transition: %s %v: illegal transition %s → %s (version %d)", e.Entity, e.ID, e.Status, e.To, e.Version)
}

// Is makes errors.Is(err, ErrIllegalTransition) true.
func (e *IllegalTransitionError) Is(target error) bool { return target == ErrIllegalTransition }

// StaleVersionError is the error of a transition whose IfVersion did not
// match.
type StaleVersionError struct {
	Entity  string // Config.Entity
	ID      any    // Apply's id
	Status  string // the row's current status
	Version int64  // the row's current version
	Want    int64  // the version given with IfVersion
	To      string // the status asked for
}

func (e *StaleVersionError) Error() string {
	return fmt.Sprintf("transition: %s %v: stale version %d (now %d, status %s) for → %s", e.Entity, e.ID, e.Want, e.Version, e.Status, e.To)
}

// Is makes errors.Is(err, ErrStaleVersion) true.
func (e *StaleVersionError) Is(target error) bool { return target == ErrStaleVersion }

// DB runs Apply's statements: a pgx.Tx, *pgx.Conn, *pgxpool.Pool or
// *pgxpool.Conn.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Result is what an Apply that returned no error did.
type Result struct {
	// To is the status asked for.
	To string
	// Status is the row's status after the call: To, or, when
	// AlreadyApplied for a passed state (Passed), the later status the
	// row is in.
	Status string
	// Version is the row's version after the call: the incremented one
	// when Changed, the current one when AlreadyApplied.
	Version int64
	// Changed is true when this call changed the row (version + 1).
	Changed bool
	// AlreadyApplied is true when the row already had status To (and,
	// with IfVersion(v), version v+1): a retry of a transition that was
	// applied before; or, without IfVersion, when the row is in a status
	// that To has been passed on the way to (Machine.Passed; Status says
	// which): a late repeat. Nothing was written.
	AlreadyApplied bool
}

// Option changes one Apply call.
type Option func(*options)

type options struct {
	version    int64
	hasVersion bool
	dest       []any
	hasDest    bool
}

// IfVersion makes Apply change the row only while its version is v (the
// optimistic lock): another version gives ErrStaleVersion, unless the row
// already has status `to` at version v+1 (a retry of this very call:
// AlreadyApplied).
func IfVersion(v int64) Option {
	return func(o *options) { o.version, o.hasVersion = v, true }
}

// Into scans Config.Returning's columns, in order, into dest when Apply
// returns a Result (from the changed row, or the current one when
// AlreadyApplied). Their count must match Config.Returning (else Apply
// returns an error before any statement); without Into the columns are
// read and dropped. On an error their contents are unspecified.
func Into(dest ...any) Option {
	return func(o *options) { o.dest, o.hasDest = dest, true }
}

// Machine applies the transitions of one entity. Safe for concurrent use.
type Machine struct {
	cfg      Config
	from     map[string][]string        // to → the statuses it is allowed from, in rule order
	reach    map[string]map[string]bool // s → the statuses one or more rules lead to from s
	update   string                     // $1 id, $2 to, $3 from (text[])
	updateV  string                     // … $4 version
	diagnose string                     // $1 id
	counts   map[string]*counts         // to → outcome counters
}

// New returns a Machine for cfg (defaults applied), or an error wrapping
// ErrInvalidConfig that names the invalid field. It runs no statement: a
// table or column that does not exist surfaces at the first Apply.
func New(cfg Config) (*Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m := &Machine{cfg: cfg, from: map[string][]string{}, counts: map[string]*counts{}}
	for _, r := range cfg.Rules {
		m.from[r.To] = append(m.from[r.To], r.From)
		if m.counts[r.To] == nil {
			m.counts[r.To] = new(counts)
		}
	}
	m.reach = reachability(cfg.Rules)
	tbl := cfg.Table.Sanitize()
	id, status, version := ident(cfg.IDColumn), ident(cfg.StatusColumn), ident(cfg.VersionColumn)
	var ret string
	for _, c := range cfg.Returning {
		ret += ", " + ident(c)
	}
	m.update = "UPDATE " + tbl + " SET " + status + " = $2, " + version + " = " + version + " + 1 WHERE " +
		id + " = $1 AND " + status + "::text = ANY($3::text[]) RETURNING " + version + ret
	m.updateV = strings.Replace(m.update, " RETURNING ", " AND "+version+" = $4 RETURNING ", 1)
	m.diagnose = "SELECT " + status + "::text, " + version + ret + " FROM " + tbl + " WHERE " + id + " = $1"
	return m, nil
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

// Config returns the Machine's configuration with the defaults applied.
func (m *Machine) Config() Config { return m.cfg }

// Allowed reports whether the rules allow from → to.
func (m *Machine) Allowed(from, to string) bool { return slices.Contains(m.from[to], from) }

// Reachable reports whether the rules lead from `from` to `to` in one or
// more transitions. A status on a cycle reaches itself.
func (m *Machine) Reachable(from, to string) bool { return m.reach[from][to] }

// Passed reports whether a row in status current has passed `to`: the
// rules lead from `to` to current (`to` is an ancestor of current on a
// declared path), and not back from current to `to`. A row that is
// SETTLED has passed CAPTURED on NEW → AUTHORIZED → CAPTURED → SETTLED; a
// VOIDED one (AUTHORIZED → VOIDED) has not. On a cycle through both
// (current and `to` reach each other), which came first cannot be told
// from the status alone (a late repeat of this round, or an early request
// of the next), so Passed is false and Apply refuses the move as illegal,
// not permanent (IllegalTransitionError.Reachable). A status is never
// passed by itself.
func (m *Machine) Passed(current, to string) bool {
	return current != to && m.reach[to][current] && !m.reach[current][to]
}

// reachability returns, for every status of rules, the statuses one or
// more rules lead to from it (a breadth-first walk from each: states ×
// rules steps, at New).
func reachability(rules []Rule) map[string]map[string]bool {
	next := map[string][]string{}
	for _, r := range rules {
		next[r.From] = append(next[r.From], r.To)
	}
	reach := map[string]map[string]bool{}
	for _, r := range rules {
		for _, s := range []string{r.From, r.To} {
			if reach[s] != nil {
				continue
			}
			seen := map[string]bool{}
			queue := append([]string(nil), next[s]...)
			for len(queue) > 0 {
				n := queue[0]
				queue = queue[1:]
				if seen[n] {
					continue
				}
				seen[n] = true
				queue = append(queue, next[n]...)
			}
			reach[s] = seen
		}
	}
	return reach
}

// maxRaces bounds Apply's UPDATE: the UPDATE is run again only when it
// changed nothing yet the row, read right after, allows the transition (a
// concurrent transaction moved it out of and back into an allowed status in
// between, under READ COMMITTED).
const maxRaces = 3

// Apply moves the row whose IDColumn is id to status `to`, in one UPDATE on
// db (see the package documentation), and returns what it did:
// Result.Changed, or Result.AlreadyApplied for a retry of an applied
// transition or a late one for a status the row has passed (Passed).
// Errors: ErrUnknownState (no rule leads to `to`),
// *IllegalTransitionError (ErrIllegalTransition; Permanent when the row
// can never reach `to`), *StaleVersionError
// (ErrStaleVersion, with IfVersion), ErrNotFound, or the database's error,
// wrapped (in a pgx.Tx, a failed statement aborts the transaction).
func (m *Machine) Apply(ctx context.Context, db DB, id any, to string, opts ...Option) (Result, error) {
	from, ok := m.from[to]
	if !ok {
		return Result{}, fmt.Errorf("%w: %s → %q", ErrUnknownState, m.cfg.Entity, to)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if !o.hasDest {
		o.dest = make([]any, len(m.cfg.Returning)) // read and dropped
		for i := range o.dest {
			o.dest[i] = new(any)
		}
	} else if len(o.dest) != len(m.cfg.Returning) {
		return Result{}, fmt.Errorf("transition: Into has %d destinations, Config.Returning %d columns: give Into one for each", len(o.dest), len(m.cfg.Returning))
	}
	c := m.counts[to]
	for range maxRaces {
		res, err := m.tryUpdate(ctx, db, id, to, from, &o)
		if err != nil || res.Changed {
			if err == nil {
				c.applied.Add(1)
			}
			return res, err
		}
		var status string
		var version int64
		err = db.QueryRow(ctx, m.diagnose, id).Scan(append([]any{&status, &version}, o.dest...)...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			c.notFound.Add(1)
			return Result{}, fmt.Errorf("%w: %s %v", ErrNotFound, m.cfg.Entity, id)
		case err != nil:
			return Result{}, fmt.Errorf("transition: %s %v: read after the update matched nothing: %w", m.cfg.Entity, id, err)
		case status == to && (!o.hasVersion || version == o.version+1), !o.hasVersion && m.Passed(status, to):
			c.alreadyApplied.Add(1)
			return Result{To: to, Status: status, Version: version, AlreadyApplied: true}, nil
		case status == to || m.Passed(status, to) || slices.Contains(from, status) && o.hasVersion && version != o.version:
			c.stale.Add(1)
			return Result{}, &StaleVersionError{Entity: m.cfg.Entity, ID: id, Status: status, Version: version, Want: o.version, To: to}
		case !slices.Contains(from, status):
			c.illegal.Add(1)
			return Result{}, &IllegalTransitionError{Entity: m.cfg.Entity, ID: id, Status: status, Version: version, To: to, Reachable: m.Reachable(status, to)}
		}
		// The row allows the transition now: it changed between the two
		// statements. Try again.
	}
	return Result{}, fmt.Errorf("transition: %s %v → %s: the row kept changing under %d attempts", m.cfg.Entity, id, to, maxRaces)
}

func (m *Machine) tryUpdate(ctx context.Context, db DB, id any, to string, from []string, o *options) (Result, error) {
	var version int64
	dest := append([]any{&version}, o.dest...)
	var err error
	if o.hasVersion {
		err = db.QueryRow(ctx, m.updateV, id, to, from, o.version).Scan(dest...)
	} else {
		err = db.QueryRow(ctx, m.update, id, to, from).Scan(dest...)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Result{}, nil
	case err != nil:
		return Result{}, fmt.Errorf("transition: %s %v → %s: %w", m.cfg.Entity, id, to, err)
	}
	return Result{To: to, Status: to, Version: version, Changed: true}, nil
}
