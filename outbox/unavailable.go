package outbox

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// ErrBrokerUnavailable marks a publish error as the broker's (or the
// network's) and not the row's: connection refused or reset, timeouts, no
// leader, not enough in-sync replicas. The relay does not count such a
// failure as an attempt of the row, records nothing on it, and pauses
// publishing with backoff (see RelayConfig.OutageBackoffInitial) until a
// probe batch gets through. Publishers wrap the errors they know to be of
// this kind with Unavailable; IsUnavailable recognizes transport errors
// without it.
var ErrBrokerUnavailable = errors.New("idemq/outbox: broker unavailable")

// Unavailable wraps err so that errors.Is(err, ErrBrokerUnavailable) holds
// and IsUnavailable reports true, keeping err's text and chain (errors.Is
// and errors.As still see err). Unavailable(nil) is nil.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return unavailableError{err}
}

type unavailableError struct{ err error }

func (e unavailableError) Error() string { return e.err.Error() }

func (e unavailableError) Unwrap() []error { return []error{ErrBrokerUnavailable, e.err} }

// IsUnavailable reports whether a publish error is about the broker or the
// network rather than about the row, so the relay waits the outage out
// instead of counting an attempt. True for errors wrapping
// ErrBrokerUnavailable (see Unavailable) and for transport errors in any
// publisher: the net package's errors (*net.OpError: dial failures,
// connection refused; *net.DNSError), any net.Error whose Timeout is true,
// connection reset, broken pipe, host or network unreachable, an
// unexpected EOF, and context.DeadlineExceeded or os.ErrDeadlineExceeded
// (the publish ran out of RelayConfig.PublishTimeout: the broker did not
// answer). The relay's own shutdown is never a failure. Every other error,
// including one no publisher classified (e.g. a record too large, an
// invalid topic, a topic authorization failure), is a row error: it counts
// an attempt and parks the row after RelayConfig.MaxAttempts.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrBrokerUnavailable) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	// Not every net.Error: broker error codes may implement it (kafka-go's
	// kafka.Error does, MessageSizeTooLarge included), so only its timeouts
	// and the net package's own errors count.
	var oe *net.OpError
	var de *net.DNSError
	var ne net.Error
	return errors.As(err, &oe) || errors.As(err, &de) || (errors.As(err, &ne) && ne.Timeout())
}
