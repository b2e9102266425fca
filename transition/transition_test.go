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
# HELP idemq_transitions_total transition.Machine.Apply calls by target status and result: applied (changed the row), already_applied (a retry), illegal (ErrIllegalTransition), stale_version (ErrStaleVersion), not_found.
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
