package dedup

import "errors"

// Crash loops: the storage side of bounding a message whose handler kills
// the process. The design is in the package documentation ("Crash loops");
// the runtime side (lane watermarks, which deliveries are checked and
// marked) is consumer's.

// ErrExecutionLost is wrapped by Result.Err of the dead letter written when a
// record's attempts ran out without their last execution ever reporting an
// outcome: in lease mode, an owner's lease expired at the last attempt (its
// process died or stalled); in atomic and batched modes, a start marker found
// that the process died while the handler ran (pgstore.Store.MarkStart).
var ErrExecutionLost = errors.New("idemq: a handler execution never reported an outcome")

// StartMark is what pgstore.Store.MarkStart decided for one handler run.
type StartMark struct {
	// Run reports whether the handler may run: the caller then calls
	// Process (its claim counts the attempt), and ClearStart if Process
	// returns an error. When false, Result is the delivery's outcome (a dead
	// letter: do not run the handler; ack).
	Run bool
	// Result is the outcome when Run is false.
	Result Result

	// Token is the store's own reference to the marker it wrote (nil when
	// nothing was marked). Callers pass the StartMark back to ClearStart
	// unchanged and never read it.
	Token any
}
