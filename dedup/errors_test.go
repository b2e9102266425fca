package dedup

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestErrorClass(t *testing.T) {
	uv := &pgconn.PgError{Code: "23505", ConstraintName: "orders_order_no_key"}
	cases := map[string]error{
		"pg:23505:orders_order_no_key":           uv,
		"pg:23505:orders_order_no_key (wrapped)": fmt.Errorf("create order: %w", uv),
		"permanent:error":                        Permanent(errors.New("bad amount")),
		"permanent:pg:23505:orders_order_no_key": Permanent(fmt.Errorf("x: %w", uv)),
		"timeout":                                fmt.Errorf("call: %w", context.DeadlineExceeded),
		"panic":                                  &PanicError{Value: "boom"},
		"error":                                  errors.New("plain"),
	}
	for want, err := range cases {
		if i := len(want) - len(" (wrapped)"); i > 0 && want[i:] == " (wrapped)" {
			want = want[:i]
		}
		if got := ErrorClass(err); got != want {
			t.Errorf("ErrorClass(%v) = %q, want %q", err, got, want)
		}
	}
	if Permanent(nil) != nil || !IsPermanent(fmt.Errorf("w: %w", Permanent(errors.New("x")))) {
		t.Fatal("Permanent")
	}
}

// selfPermanent is an error of a package that cannot import dedup (such as
// transition.IllegalTransitionError) and says by itself whether retrying
// can help.
type selfPermanent struct{ permanent bool }

func (e selfPermanent) Error() string   { return "self-permanent" }
func (e selfPermanent) Permanent() bool { return e.permanent }

// An error with a Permanent() bool method that returns true, anywhere in
// the chain, is permanent: IsPermanent, Classify and ErrorClass agree; one
// whose method returns false is not.
func TestPermanentMethod(t *testing.T) {
	yes := fmt.Errorf("handler: %w", selfPermanent{true})
	no := fmt.Errorf("handler: %w", selfPermanent{false})
	if !IsPermanent(yes) || Classify(yes) != FailurePermanent || ErrorClass(yes) != "permanent:error" {
		t.Errorf("Permanent() true: IsPermanent %v, Classify %q, ErrorClass %q; want true, permanent, permanent:error", IsPermanent(yes), Classify(yes), ErrorClass(yes))
	}
	if IsPermanent(no) || Classify(no) != FailureHandler || ErrorClass(no) != "error" {
		t.Errorf("Permanent() false: IsPermanent %v, Classify %q, ErrorClass %q; want false, handler, error", IsPermanent(no), Classify(no), ErrorClass(no))
	}
	if got := ErrorClass(Permanent(yes)); got != "permanent:error" {
		t.Errorf("ErrorClass of both kinds at once = %q, want permanent:error", got)
	}
}
