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
