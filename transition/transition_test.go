package transition

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var orderRules = append(Path("PENDING", "PAID", "SHIPPED"), Rule{From: "PENDING", To: "CANCELLED"})

func TestConfigValidate(t *testing.T) {
	tbl := pgx.Identifier{"shop", "orders"}
	long := strings.Repeat("c", MaxIdentifierBytes+1)
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{Rules: orderRules}, "Table"},
		{Config{Table: pgx.Identifier{"a", "b", "c", "d"}, Rules: orderRules}, "Table"},
		{Config{Table: pgx.Identifier{"shop", ""}, Rules: orderRules}, "Table[1]"},
		{Config{Table: pgx.Identifier{long}, Rules: orderRules}, "Table[0]"},
		{Config{Table: pgx.Identifier{"a\x00b"}, Rules: orderRules}, "Table[0]"},
		{Config{Table: tbl, IDColumn: long, Rules: orderRules}, "IDColumn"},
		{Config{Table: tbl, StatusColumn: "id", Rules: orderRules}, "StatusColumn"},
		{Config{Table: tbl, VersionColumn: "status", Rules: orderRules}, "VersionColumn"},
		{Config{Table: tbl, Returning: []string{"amount", ""}, Rules: orderRules}, "Returning[1]"},
		{Config{Table: tbl}, "Rules"},
		{Config{Table: tbl, Rules: []Rule{{From: "", To: "PAID"}}}, "Rules[0].From"},
		{Config{Table: tbl, Rules: []Rule{{From: "PENDING", To: " PAID"}}}, "Rules[0].To"},
		{Config{Table: tbl, Rules: []Rule{{From: "PAID", To: "PAID"}}}, "Rules[0]"},
		{Config{Table: tbl, Rules: append(Path("A", "B"), Rule{From: "A", To: "B"})}, "Rules[1]"},
		{Config{Table: tbl, Rules: orderRules, Entity: strings.Repeat("e", 256)}, "Entity"},
	} {
		err := c.cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig naming %s", c.cfg, err, c.field)
		}
		if _, nerr := New(c.cfg); nerr == nil || nerr.Error() != err.Error() {
			t.Errorf("New(%+v) = %v, want Validate's %v", c.cfg, nerr, err)
		}
	}
}

// The statements are the documented ones, with every name quoted.
func TestStatements(t *testing.T) {
	m, err := New(Config{Table: pgx.Identifier{"shop", `my"orders`}, Returning: []string{"amount"}, Rules: orderRules})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want string }{
		{m.update, `UPDATE "shop"."my""orders" SET "status" = $2, "version" = "version" + 1 WHERE "id" = $1 AND "status"::text = ANY($3::text[]) RETURNING "version", "amount"`},
		{m.updateV, `UPDATE "shop"."my""orders" SET "status" = $2, "version" = "version" + 1 WHERE "id" = $1 AND "status"::text = ANY($3::text[]) AND "version" = $4 RETURNING "version", "amount"`},
		{m.diagnose, `SELECT "status"::text, "version", "amount" FROM "shop"."my""orders" WHERE "id" = $1`},
	} {
		if c.got != c.want {
			t.Errorf("statement\n got %s\nwant %s", c.got, c.want)
		}
	}
	if cfg := m.Config(); cfg.Entity != `my"orders` || cfg.IDColumn != "id" {
		t.Errorf("defaults = %+v", cfg)
	}
	if !m.Allowed("PENDING", "CANCELLED") || m.Allowed("PAID", "CANCELLED") || m.Allowed("SHIPPED", "PAID") {
		t.Error("Allowed disagrees with the rules")
	}
	if _, err := m.Apply(t.Context(), nil, 1, "REFUNDED"); !errors.Is(err, ErrUnknownState) {
		t.Errorf("Apply to an undeclared status = %v, want ErrUnknownState", err)
	}
	if _, err := m.Apply(t.Context(), nil, 1, "PAID", Into()); err == nil {
		t.Error("Apply with Into of 0 destinations for 1 Returning column: no error")
	}
}

func TestErrorsMatch(t *testing.T) {
	var err error = &IllegalTransitionError{Entity: "orders", ID: 7, Status: "SHIPPED", Version: 3, To: "CANCELLED"}
	if !errors.Is(err, ErrIllegalTransition) || errors.Is(err, ErrStaleVersion) {
		t.Errorf("%v does not match ErrIllegalTransition alone", err)
	}
	err = &StaleVersionError{Entity: "orders", ID: 7, Status: "PENDING", Version: 4, Want: 3, To: "PAID"}
	if !errors.Is(err, ErrStaleVersion) || errors.Is(err, ErrIllegalTransition) {
		t.Errorf("%v does not match ErrStaleVersion alone", err)
	}
}

// Machines of two entities register with one registry; one Machine with
// two registries.
func TestCollectorRegistersSeveralTimes(t *testing.T) {
	orders, _ := New(Config{Table: pgx.Identifier{"orders"}, Rules: orderRules})
	payments, _ := New(Config{Table: pgx.Identifier{"payments"}, Rules: Path("NEW", "CAPTURED")})
	orders.counts["CANCELLED"].illegal.Add(1)
	r1, r2 := prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()
	r1.MustRegister(orders.Collector(), payments.Collector())
	r2.MustRegister(orders.Collector())
	if err := r1.Register(orders.Collector()); err == nil {
		t.Error("the same entity registered twice with one registry: no error")
	}
	for _, c := range []struct {
		r    *prometheus.Registry
		want int
	}{{r1, 4 * 5}, {r2, 3 * 5}} { // target statuses × results
		if n, err := testutil.GatherAndCount(c.r); err != nil || n != c.want {
			t.Errorf("gathered %d series (%v), want %d", n, err, c.want)
		}
	}
	want := `
# HELP idemq_transitions_total transition.Machine.Apply calls by target status and result: applied (changed the row), already_applied (a retry, or a late request for a status the row has passed), illegal (ErrIllegalTransition), stale_version (ErrStaleVersion), not_found.
# TYPE idemq_transitions_total counter
`
	for _, to := range []string{"CANCELLED", "PAID", "SHIPPED"} {
		for _, r := range []string{"already_applied", "applied", "illegal", "not_found", "stale_version"} {
			v := "0"
			if to == "CANCELLED" && r == "illegal" {
				v = "1"
			}
			want += `idemq_transitions_total{entity="orders",result="` + r + `",to="` + to + `"} ` + v + "\n"
		}
	}
	if err := testutil.GatherAndCompare(r2, strings.NewReader(want), "idemq_transitions_total"); err != nil {
		t.Error(err)
	}
}

// fakeDB answers Apply's statements from a script: each UPDATE pops the
// next entry of updates (nil: no row), each diagnosis read pops the next
// entry of rows (nil: no row).
type fakeDB struct {
	updates []*int64
	rows    []*fakeRow
	calls   []string
}

type fakeRow struct {
	status  string
	version int64
}

type scanFunc func(dest ...any) error

func (f scanFunc) Scan(dest ...any) error { return f(dest...) }

func (db *fakeDB) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	if strings.HasPrefix(sql, "UPDATE") {
		db.calls = append(db.calls, "update")
		v := db.updates[0]
		db.updates = db.updates[1:]
		return scanFunc(func(dest ...any) error {
			if v == nil {
				return pgx.ErrNoRows
			}
			*dest[0].(*int64) = *v
			return nil
		})
	}
	db.calls = append(db.calls, "read")
	r := db.rows[0]
	db.rows = db.rows[1:]
	return scanFunc(func(dest ...any) error {
		if r == nil {
			return pgx.ErrNoRows
		}
		*dest[0].(*string), *dest[1].(*int64) = r.status, r.version
		return nil
	})
}

// The row moved out of and back into an allowed status between the UPDATE
// and the read (a cycle, under READ COMMITTED): Apply runs the UPDATE
// again, a bounded number of times.
func TestApplyRetriesARaceBounded(t *testing.T) {
	m, err := New(Config{Table: pgx.Identifier{"orders"}, Rules: append(orderRules, Rule{From: "PAID", To: "PENDING"})})
	if err != nil {
		t.Fatal(err)
	}
	three := int64(3)
	db := &fakeDB{updates: []*int64{nil, &three}, rows: []*fakeRow{{"PENDING", 2}}}
	res, err := m.Apply(t.Context(), db, "o-1", "PAID")
	if err != nil || !res.Changed || res.Version != 3 || strings.Join(db.calls, ",") != "update,read,update" {
		t.Fatalf("Apply = %+v, %v after %v; want changed at version 3 after update,read,update", res, err, db.calls)
	}
	db = &fakeDB{updates: []*int64{nil, nil, nil}, rows: []*fakeRow{{"PENDING", 2}, {"PENDING", 4}, {"PENDING", 6}}}
	if _, err := m.Apply(t.Context(), db, "o-1", "PAID"); err == nil || !strings.Contains(err.Error(), "kept changing") || len(db.calls) != 2*maxRaces {
		t.Fatalf("Apply on a row that keeps changing = %v after %v; want an error after %d rounds", err, db.calls, maxRaces)
	}
}

// s26Rules is S26's declared path NEW → AUTHORIZED → CAPTURED → SETTLED,
// with the branch AUTHORIZED → VOIDED that never reaches CAPTURED.
var s26Rules = append(Path("NEW", "AUTHORIZED", "CAPTURED", "SETTLED"), Rule{From: "AUTHORIZED", To: "VOIDED"})

// permanent reports whether err says that retrying cannot help, the way
// dedup.IsPermanent reads it (a Permanent() bool method in the chain).
func permanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

// S26: a late CAPTURED for an order that is SETTLED (a state CAPTURED
// leads to) is already applied: nothing written, the current version; a
// CAPTURED for a VOIDED order (which can never reach CAPTURED) is illegal
// and permanent; a SETTLED for an AUTHORIZED order (reachable, a step
// missing) is illegal but not permanent.
func TestApplyPassedState(t *testing.T) {
	m, err := New(Config{Table: pgx.Identifier{"payments"}, Rules: s26Rules})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		db := &fakeDB{updates: []*int64{nil}, rows: []*fakeRow{{"SETTLED", 3}}}
		res, err := m.Apply(t.Context(), db, "o-26", "CAPTURED")
		if err != nil || res.Changed || !res.AlreadyApplied || res.Version != 3 || res.To != "CAPTURED" || res.Status != "SETTLED" || strings.Join(db.calls, ",") != "update,read" {
			t.Fatalf("CAPTURED on a SETTLED order = %+v, %v after %v; want already applied at version 3, one update and one read", res, err, db.calls)
		}
	}
	db := &fakeDB{updates: []*int64{nil}, rows: []*fakeRow{{"VOIDED", 2}}}
	_, err = m.Apply(t.Context(), db, "o-26v", "CAPTURED")
	var illegal *IllegalTransitionError
	if !errors.As(err, &illegal) || illegal.Status != "VOIDED" || !permanent(err) {
		t.Fatalf("CAPTURED on a VOIDED order = %v; want a permanent IllegalTransitionError from VOIDED", err)
	}
	db = &fakeDB{updates: []*int64{nil}, rows: []*fakeRow{{"AUTHORIZED", 1}}}
	_, err = m.Apply(t.Context(), db, "o-early", "SETTLED")
	if !errors.As(err, &illegal) || illegal.Status != "AUTHORIZED" || permanent(err) {
		t.Fatalf("SETTLED on an AUTHORIZED order = %v; want an IllegalTransitionError that is not permanent (CAPTURED may come)", err)
	}
	// With IfVersion the caller's read is out of date: its own transition
	// is not known to have happened.
	db = &fakeDB{updates: []*int64{nil}, rows: []*fakeRow{{"SETTLED", 3}}}
	if _, err := m.Apply(t.Context(), db, "o-26", "CAPTURED", IfVersion(1)); !errors.Is(err, ErrStaleVersion) {
		t.Fatalf("CAPTURED if version 1 on a SETTLED order = %v; want ErrStaleVersion", err)
	}
	if c := m.Stats()["CAPTURED"]; c.AlreadyApplied != 2 || c.Illegal != 1 || c.StaleVersion != 1 {
		t.Fatalf("CAPTURED counts = %+v; want 2 already applied, 1 illegal, 1 stale", c)
	}
}

// Reachable and Passed follow the declared graph: every descendant is
// reachable, an ancestor on a path is passed, a sibling branch is neither;
// on a cycle nothing is passed (the order of two statuses that reach each
// other cannot be told from the status), and a status never passes itself.
func TestReachability(t *testing.T) {
	m, err := New(Config{Table: pgx.Identifier{"payments"}, Rules: s26Rules})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from, to          string
		reachable, passed bool // Reachable(from, to); Passed(current=to, to=from)
	}{
		{"NEW", "SETTLED", true, true},
		{"AUTHORIZED", "SETTLED", true, true},
		{"CAPTURED", "SETTLED", true, true},
		{"AUTHORIZED", "VOIDED", true, true},
		{"NEW", "VOIDED", true, true},
		{"CAPTURED", "VOIDED", false, false},
		{"VOIDED", "CAPTURED", false, false},
		{"SETTLED", "CAPTURED", false, false},
		{"SETTLED", "SETTLED", false, false},
		{"REFUNDED", "SETTLED", false, false}, // not a declared status
	} {
		if got := m.Reachable(c.from, c.to); got != c.reachable {
			t.Errorf("Reachable(%s, %s) = %v, want %v", c.from, c.to, got, c.reachable)
		}
		if got := m.Passed(c.to, c.from); got != c.passed {
			t.Errorf("Passed(current %s, to %s) = %v, want %v", c.to, c.from, got, c.passed)
		}
	}

	// A cycle: ACTIVE → SUSPENDED → REVIEW → ACTIVE, with ACTIVE → CLOSED
	// leaving it. Inside the cycle no status has passed another; CLOSED
	// has passed all three.
	cyc, err := New(Config{Table: pgx.Identifier{"subscriptions"},
		Rules: append(Path("NEW", "ACTIVE", "SUSPENDED", "REVIEW", "ACTIVE"), Rule{From: "ACTIVE", To: "CLOSED"})})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"ACTIVE", "SUSPENDED", "REVIEW"} {
		if !cyc.Reachable(s, s) || cyc.Passed(s, s) {
			t.Errorf("%s on a cycle: Reachable to itself %v (want true), Passed by itself %v (want false)", s, cyc.Reachable(s, s), cyc.Passed(s, s))
		}
		if !cyc.Passed("CLOSED", s) || cyc.Passed(s, "CLOSED") {
			t.Errorf("CLOSED has passed %s: %v (want true); %s has passed CLOSED: %v (want false)", s, cyc.Passed("CLOSED", s), s, cyc.Passed(s, "CLOSED"))
		}
		if !cyc.Passed(s, "NEW") {
			t.Errorf("%s has not passed NEW", s)
		}
	}
	if cyc.Passed("REVIEW", "SUSPENDED") || cyc.Passed("SUSPENDED", "REVIEW") {
		t.Error("a status on the cycle has passed another on it")
	}
	// A late SUSPENDED for a subscription in REVIEW: not passed, not
	// allowed, reachable: illegal, not permanent (retried).
	db := &fakeDB{updates: []*int64{nil}, rows: []*fakeRow{{"REVIEW", 4}}}
	_, err = cyc.Apply(t.Context(), db, "s-1", "SUSPENDED")
	var illegal *IllegalTransitionError
	if !errors.As(err, &illegal) || !illegal.Reachable || permanent(err) {
		t.Fatalf("SUSPENDED on a subscription in REVIEW = %v; want an IllegalTransitionError, reachable, not permanent", err)
	}
}
