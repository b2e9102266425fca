package storetest

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/dedup"
)

// Handler is the business logic the suite runs in every mode: a lease-mode
// handler, or a TxHandler that ignores its transaction (the suite's
// effects are counted in memory, by successful handler returns).
type Handler func(ctx context.Context, msg *dedup.Message) error

// Mode is how the suite hands one delivery to the store: lease mode
// (Leased), atomic mode (Atomic) or batched atomic mode (Batched). A store
// that runs in several modes is checked by one Run per mode.
type Mode struct {
	// Name names the mode in failures and skips ("lease", "atomic",
	// "batched").
	Name string
	// Lease is true for lease mode: the lease cases (takeover and fencing,
	// interrupted handlers) run only then, and crash loops are dying lease
	// owners instead of start markers.
	Lease bool
	// Process runs h for msg and returns the store's Result and error, as
	// the runtime would see them.
	Process func(ctx context.Context, msg *dedup.Message, h Handler) (dedup.Result, error)
	// Batch runs h for msgs in one call, one Result per message in order
	// (batched mode only; nil otherwise: the BatchInOrder case is skipped).
	Batch func(ctx context.Context, msgs []*dedup.Message, h Handler) ([]dedup.Result, error)
}

// Leased is lease mode on st: Store.ProcessLeased with opt (zero fields get
// LeaseOptions' defaults: TTL 30 s, heartbeat TTL/3). The lease cases pass
// options of their own.
func Leased(st dedup.Store, opt dedup.LeaseOptions) Mode {
	return Mode{Name: "lease", Lease: true, Process: func(ctx context.Context, msg *dedup.Message, h Handler) (dedup.Result, error) {
		return st.ProcessLeased(ctx, msg, dedup.LeaseHandler(h), opt)
	}}
}

// Atomic is atomic mode on st: TxStore.Process, the handler inside the
// store's transaction (it ignores the transaction).
func Atomic[Tx any](st dedup.TxStore[Tx]) Mode {
	return Mode{Name: "atomic", Process: func(ctx context.Context, msg *dedup.Message, h Handler) (dedup.Result, error) {
		return st.Process(ctx, msg, func(ctx context.Context, _ Tx, m *dedup.Message) error { return h(ctx, m) })
	}}
}

// Batched is batched atomic mode on st: TxStore.ProcessBatch with a batch of
// one delivery per call, and Mode.Batch for the BatchInOrder case, which
// sends several.
func Batched[Tx any](st dedup.TxStore[Tx]) Mode {
	batch := func(ctx context.Context, msgs []*dedup.Message, h Handler) ([]dedup.Result, error) {
		res, err := st.ProcessBatch(ctx, msgs, func(ctx context.Context, _ Tx, m *dedup.Message) error { return h(ctx, m) })
		if err == nil && len(res) != len(msgs) {
			err = fmt.Errorf("storetest: ProcessBatch of %d messages returned %d results", len(msgs), len(res))
		}
		return res, err
	}
	return Mode{Name: "batched", Batch: batch, Process: func(ctx context.Context, msg *dedup.Message, h Handler) (dedup.Result, error) {
		res, err := batch(ctx, []*dedup.Message{msg}, h)
		if err != nil {
			return dedup.Result{}, err
		}
		return res[0], nil
	}}
}

// Admin is the operator's side of a store that the suite reads and drives:
// *pgstore.Store, *redisstore.Store and *memstore.Store implement it.
type Admin interface {
	// Lookup returns the record of (scope, message ID), or an error
	// wrapping dedup.ErrNotFound.
	Lookup(ctx context.Context, scope, messageID string) (dedup.Record, error)
	// DeadLetters lists the dead letters of scope after ID afterID, oldest
	// first, at most limit.
	DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error)
	// Redrive makes a FAILED_FINAL record retryable; dedup.ErrNotFinal
	// for a record in another status, dedup.ErrNotFound for none.
	Redrive(ctx context.Context, scope, messageID string) error
}

// StartMarker is the crash-loop storage of atomic and batched modes, as
// consumer.StartMarker declares it (the part the suite checks):
// *pgstore.Store implements it. The suite finds it on Harness.Store by a
// type assertion.
type StartMarker interface {
	// MarkStart writes a start marker before a handler run, or dead-letters
	// the delivery when its record's attempts are used up (Run false).
	MarkStart(ctx context.Context, msg *dedup.Message) (dedup.StartMark, error)
	// ClearStart withdraws a marker whose run returned without an outcome.
	ClearStart(ctx context.Context, m dedup.StartMark) error
}

// Harness is one fresh, empty store for one case, with what the suite needs
// beyond dedup.Store. newStore builds one per case (each case runs in
// parallel with the others, so the stores must not share records: a schema,
// key prefix or instance of their own), and registers its teardown with
// t.Cleanup.
//
// The store must be configured with MaxAttempts from 3 to 10 (the suite
// fails otherwise) and a SucceededRetention of at least a minute (the
// retention case ends a record's retention with ExpireRecord instead of
// waiting for it).
type Harness struct {
	// Store is the store under test. Required.
	Store dedup.Store
	// Mode is how deliveries reach Store. Required (Name and Process set).
	Mode Mode
	// Admin reads records and dead letters and re-drives. Required.
	Admin Admin
	// ExpireLease ends the lease on the record of (scope, messageID) now,
	// as if its TTL had passed without renewal, without touching its owner
	// token or fence. Required in lease mode.
	ExpireLease func(ctx context.Context, scope, messageID string) error
	// ExpireRecord ends the retention of the record of (scope, messageID)
	// now, as if its expiry time had passed. Required unless
	// Features.NoPurge.
	ExpireRecord func(ctx context.Context, scope, messageID string) error
	// Purge deletes the expired records, as the operator's scheduled purge
	// does. Nil for a store whose records expire by themselves (Redis key
	// TTLs): the suite then waits, up to 30 s, for the expired record to go.
	Purge func(ctx context.Context) error
}

func (h Harness) validate() error {
	switch {
	case h.Store == nil:
		return fmt.Errorf("storetest: Harness.Store is nil")
	case h.Mode.Process == nil || h.Mode.Name == "":
		return fmt.Errorf("storetest: Harness.Mode is not set (use Leased, Atomic or Batched)")
	case h.Admin == nil:
		return fmt.Errorf("storetest: Harness.Admin is nil")
	case h.Mode.Lease && h.ExpireLease == nil:
		return fmt.Errorf("storetest: Harness.ExpireLease is required in lease mode")
	case h.Store.MaxAttempts() < 3 || h.Store.MaxAttempts() > 10:
		return fmt.Errorf("storetest: the store's MaxAttempts is %d; configure 3 to 10", h.Store.MaxAttempts())
	}
	return nil
}

// Features marks what a store cannot do. The suite does not run the cases
// that need it and logs them once, naming the feature.
type Features struct {
	// NoStartMarkers: in atomic or batched mode, the store does not
	// implement StartMarker, so a handler that kills its process is not
	// bounded by the store; skips CrashLoop in those modes (the runtime runs
	// without markers on such a store). Lease mode bounds crash loops with
	// the lease itself and ignores this flag.
	NoStartMarkers bool
	// NoPurge: the store keeps records forever (no retention); skips
	// RetentionPurge.
	NoPurge bool
	// NoRedrive: the store has no operator re-drive; skips Redrive.
	NoRedrive bool
}
