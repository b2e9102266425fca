package outbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
)

// codeErr is a broker error code that implements net.Error, as kafka-go's
// kafka.Error does: only its timeouts may count as unavailable.
type codeErr struct{ timeout bool }

func (e codeErr) Error() string   { return "code" }
func (e codeErr) Timeout() bool   { return e.timeout }
func (e codeErr) Temporary() bool { return true }

// IsUnavailable tells the broker's errors from the row's.
func TestIsUnavailable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("record too large"), false},
		{fmt.Errorf("topic x: %w", errors.New("invalid topic")), false},
		{codeErr{}, false},
		{codeErr{timeout: true}, true},
		{Unavailable(errors.New("leader not available")), true},
		{fmt.Errorf("produce: %w", Unavailable(errors.New("x"))), true},
		{refused, true},
		{fmt.Errorf("send: %w", syscall.ECONNRESET), true},
		{context.DeadlineExceeded, true},
		{os.ErrDeadlineExceeded, true},
		{&net.DNSError{Err: "no such host", Name: "kafka"}, true},
		{PublishErrors{nil, Unavailable(errors.New("x"))}, true},
	} {
		if got := IsUnavailable(tc.err); got != tc.want {
			t.Errorf("IsUnavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	inner := errors.New("inner")
	w := Unavailable(inner)
	if !errors.Is(w, inner) || !errors.Is(w, ErrBrokerUnavailable) || w.Error() != "inner" || Unavailable(nil) != nil {
		t.Fatalf("Unavailable(inner) = %v: want inner's text, errors.Is inner and ErrBrokerUnavailable; Unavailable(nil) nil", w)
	}
}
