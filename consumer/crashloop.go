package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// CrashLoopConfig configures how a Consumer bounds a message whose handler
// kills the process (atomic and batched modes, Config.Handler), with a store
// that implements StartMarker (*pgstore.Store). The design and its cost are in
// the package documentation, "Crash loops". Lease mode needs none of it: its
// claim counts every start.
type CrashLoopConfig struct {
	// Off turns lane watermarks and start markers off: a message whose
	// handler kills the process is then redelivered after every restart,
	// forever, and a crash costs no extra statement. Default false (on).
	Off bool
	// Window is how many offsets past the delivery about to run a lane
	// watermark write covers: a lane writes its watermark (one upsert of one
	// row) at most once per Window+1 offsets, and nothing for the deliveries
	// in between. Default 1000; 1 to 1,000,000,000. It does not change how
	// many deliveries are checked after a restart (see InFlight).
	Window int64
	// InFlight is, in push mode (Handle, HandleInPlace, Pusher.Handle), how many deliveries
	// of one lane may run at once: after a start, up to this many
	// deliveries of a lane that lie at or below its watermark and have no
	// final record get a start marker each and run one at a time,
	// process-wide. Default 1; 1 to 1,000,000,000; a Pusher (Consumer.Push)
	// uses PushConfig.ConcurrentCalls × DeliveriesPerCall when it is 0
	// (rocketmqadapter: ConsumeGoroutines × BatchMaxSize). Run (pull mode) ignores
	// it: a pull lane runs one delivery, or one batch of BatchSize, at a time,
	// so it uses BatchSize.
	InFlight int
}

// Defaults and bounds of CrashLoopConfig.
const (
	// DefaultCrashLoopWindow is CrashLoopConfig.Window's default: 1000
	// offsets per watermark write.
	DefaultCrashLoopWindow = 1000
	maxCrashLoopWindow     = 1_000_000_000
	maxCrashLoopInFlight   = 1_000_000_000
)

func (c CrashLoopConfig) withDefaults() CrashLoopConfig {
	if c.Window == 0 {
		c.Window = DefaultCrashLoopWindow
	}
	if c.InFlight == 0 {
		c.InFlight = 1
	}
	return c
}

func (c CrashLoopConfig) validate() error {
	switch {
	case c.Window < 1 || c.Window > maxCrashLoopWindow:
		return fmt.Errorf("%w: CrashLoop.Window %d must be 1 to %d offsets", ErrInvalidConfig, c.Window, maxCrashLoopWindow)
	case c.InFlight < 1 || c.InFlight > maxCrashLoopInFlight:
		return fmt.Errorf("%w: CrashLoop.InFlight %d must be 1 to %d deliveries", ErrInvalidConfig, c.InFlight, maxCrashLoopInFlight)
	}
	return nil
}

// StartMarker is the storage a Consumer bounds crash loops with; *pgstore.Store
// implements it (its methods document each contract). With a Config.Store
// that does not implement it, a Consumer runs without start markers.
type StartMarker interface {
	// AdvanceLaneWatermark raises the watermark of (scope, lane) to at
	// least to and returns the previous one (-1: none).
	AdvanceLaneWatermark(ctx context.Context, scope, lane string, to int64) (prev int64, err error)
	// CheckReplay returns the duplicate result of a delivery whose record
	// is already final (done true), with one read.
	CheckReplay(ctx context.Context, msg *dedup.Message) (res dedup.Result, done bool, err error)
	// MarkStart writes a start marker before a handler run that may replay
	// a crash, or dead-letters the delivery (Run false).
	MarkStart(ctx context.Context, msg *dedup.Message) (dedup.StartMark, error)
	// ClearStart withdraws a marker whose run returned without an outcome.
	ClearStart(ctx context.Context, m dedup.StartMark) error
}

// crashGuard is a Consumer's crash-loop state: its lanes' sessions and the
// process-wide turn of marked runs.
type crashGuard struct {
	sm           StartMarker
	scope        string
	window       int64
	pullInFlight int // BatchSize
	pushInFlight int // CrashLoop.InFlight
	log          *slog.Logger
	// serial lets one marked run at a time hold it, process-wide: when the
	// process dies during a marked run, that run is the only marked one the
	// death is charged to (runs of other lanes then are unmarked, and an
	// unmarked run is never dead-lettered for a death).
	serial chan struct{}

	mu   sync.Mutex
	push map[string]*laneSession
}

// newCrashGuard returns nil when crash-loop bounding does not apply: turned
// off, lease mode, or a store without start markers.
func newCrashGuard(cfg Config, log *slog.Logger) *crashGuard {
	sm, ok := cfg.Store.(StartMarker)
	if cfg.CrashLoop.Off || txHandler(cfg) == nil || !ok {
		return nil
	}
	return &crashGuard{sm: sm, scope: cfg.Scope, window: cfg.CrashLoop.Window, pullInFlight: cfg.BatchSize,
		pushInFlight: cfg.CrashLoop.InFlight, log: log, serial: make(chan struct{}, 1), push: map[string]*laneSession{}}
}

// pushSession returns the session of lane for Handle, one per lane for the
// Consumer's life (nil without a guard or a lane).
func (g *crashGuard) pushSession(lane string) *laneSession {
	if g == nil {
		return nil
	}
	return g.pushSessionN(lane, g.pushInFlight)
}

// pushSessionN is pushSession for a lane that may run up to inFlight
// deliveries at once (Pusher: PushConfig's concurrency unless
// CrashLoop.InFlight is set); the first call for a lane decides.
func (g *crashGuard) pushSessionN(lane string, inFlight int) *laneSession {
	if g == nil || lane == "" {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.push[lane]
	if s == nil {
		s = &laneSession{g: g, lane: lane, inFlight: inFlight}
		g.push[lane] = s
	}
	return s
}

// pullSession returns a new session for a pull lane run by Run.
func (g *crashGuard) pullSession(lane string) *laneSession {
	if g == nil || lane == "" {
		return nil
	}
	return &laneSession{g: g, lane: lane, inFlight: g.pullInFlight, pull: true}
}

// laneSession is what one lane knows in this process: since when its
// deliveries may be crash replays, and how many of them it still marks.
type laneSession struct {
	g        *crashGuard
	lane     string
	inFlight int
	pull     bool

	mu      sync.Mutex
	started bool
	w0      int64          // deliveries at or below this offset may be crash replays
	covered int64          // the stored watermark is at least this
	budget  int            // marked runs left in this session
	marked  map[int64]bool // offsets marked in this session: their retries are marked too
	last    int64          // pull: highest offset received
	hasLast bool
	claim   context.Context // pull: the lane context (Revocable.LaneContext) of the deliveries received; nil: none
}

// received notes that a pull lane got a delivery at off, fetched under the
// lane context lc (Revocable.LaneContext; nil when the source cannot revoke
// lanes). A new session starts, reading the watermark again, when the lane
// may have been run by another process in between: when the context of the
// deliveries received before has ended (the lane was revoked, and d belongs
// to a later assignment of it), or when off is not above the last offset
// received (the broker handed the lane back from its committed offset, a
// rebalance of a source that cannot tell). The first catches what the second
// cannot: a lane handed back above every offset this session saw, which the
// lane's next owner ran meanwhile and may have died in; without a new
// session those deliveries would run unmarked below the covered watermark.
func (s *laneSession) received(lc context.Context, off int64) {
	if s == nil || !s.pull {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	revoked := s.claim != nil && s.claim.Err() != nil
	if revoked || (s.hasLast && off <= s.last) {
		s.started, s.marked = false, nil
	}
	s.last, s.hasLast = off, true
	if lc != nil {
		s.claim = lc
	}
}

// admit makes the lane's stored watermark cover upTo before a handler may
// run there: when it does not yet, one upsert raises it to upTo+Window. The
// first call of a session learns the watermark left by earlier processes
// (w0); a later one that finds the watermark above what this session wrote
// learns that another process ran the lane meanwhile.
func (s *laneSession) admit(ctx context.Context, upTo int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started && upTo <= s.covered {
		return nil
	}
	to := upTo + s.g.window
	prev, err := s.g.sm.AdvanceLaneWatermark(ctx, s.g.scope, s.lane, to)
	if err != nil {
		return fmt.Errorf("idemq/consumer: %w", err)
	}
	switch {
	case !s.started:
		s.started, s.w0, s.budget, s.marked = true, prev, s.inFlight, map[int64]bool{}
		if upTo <= prev {
			s.g.log.InfoContext(ctx, "idemq: lane starts at or below its watermark: its first unfinished deliveries may replay a crash and run after a start marker",
				"lane", s.lane, "offset", upTo, "watermark", prev, "marked_at_most", s.inFlight)
		}
	case prev > s.covered:
		s.w0, s.budget = max(s.w0, prev), s.inFlight
	}
	s.covered = max(prev, to)
	return nil
}

// runKind is how a delivery runs.
type runKind int

const (
	runPlain  runKind = iota // a first delivery: Process alone
	runCheck                 // may be a crash replay: CheckReplay, then marked unless final
	runMarked                // a marked delivery's retry: marked again
)

// kind classifies the delivery at off; admit must have covered it.
func (s *laneSession) kind(off int64) runKind {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.started || off > s.w0:
		return runPlain
	case s.marked[off]:
		return runMarked
	case s.budget > 0:
		return runCheck
	}
	return runPlain
}

// take spends one marked run of the session's budget on off; false when the
// budget is spent.
func (s *laneSession) take(off int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.marked[off] {
		return true
	}
	if s.budget == 0 {
		return false
	}
	s.budget--
	s.marked[off] = true
	return true
}

// processTx runs msg (delivery d) in atomic mode with handler h, with a start marker when it
// may replay a crash (sess nil: none).
func (c *Consumer) processTx(ctx context.Context, msg *dedup.Message, d Delivery, sess *laneSession, h dedup.TxHandler[pgx.Tx]) (dedup.Result, error) {
	st := c.tx
	if sess == nil {
		return st.Process(ctx, msg, h)
	}
	if err := sess.admit(ctx, d.Offset); err != nil {
		return dedup.Result{}, err
	}
	switch sess.kind(d.Offset) {
	case runPlain:
		return st.Process(ctx, msg, h)
	case runCheck:
		res, done, err := sess.g.sm.CheckReplay(ctx, msg)
		if err != nil || done {
			return res, err
		}
		if !sess.take(d.Offset) {
			return st.Process(ctx, msg, h)
		}
	}
	return sess.g.runMarked(ctx, msg, func() (dedup.Result, error) { return st.Process(ctx, msg, h) })
}

// runMarked writes a start marker for msg and runs process, alone among the
// process's marked runs. A marker that finds the attempts used up by runs
// that died returns the dead letter instead; a run that returns without an
// outcome withdraws its marker.
func (g *crashGuard) runMarked(ctx context.Context, msg *dedup.Message, process func() (dedup.Result, error)) (dedup.Result, error) {
	select {
	case g.serial <- struct{}{}:
	case <-ctx.Done():
		return dedup.Result{}, fmt.Errorf("idemq/consumer: waiting to run a marked delivery: %w", ctx.Err())
	}
	defer func() { <-g.serial }()
	m, err := g.sm.MarkStart(ctx, msg)
	if err != nil {
		return dedup.Result{}, fmt.Errorf("idemq/consumer: %w", err)
	}
	if !m.Run {
		return m.Result, nil
	}
	res, err := process()
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if cerr := g.sm.ClearStart(cctx, m); cerr != nil {
			g.log.WarnContext(ctx, "idemq: start marker not withdrawn; the next start may count this run as a crash", "message_id", msg.Identity.MessageID, "err", cerr)
		}
		cancel()
	}
	return res, err
}

// errLaneRevoked is runReplays' error when the lane of the delivery in hand
// was revoked (Revocable): the caller drops the revoked deliveries.
var errLaneRevoked = errors.New("idemq/consumer: lane revoked")

// runReplays runs, one at a time and in place, the deliveries at the front
// of a pull batch that may replay a crash (each like Handle: admitted,
// checked, marked), so that a death is charged to the one delivery running,
// never to a whole batch. It returns how many it completed (acked, each
// passed to com), then makes the lane's watermark cover the rest of pending,
// which may run as a batch. err is a database error (retry later), ctx's, or
// errLaneRevoked: a delivery's lane was revoked before or while it ran in
// place (its retries stop as in lane).
func (c *Consumer) runReplays(ctx, work context.Context, pending []Delivery, com *committer, sess *laneSession) (int, error) {
	if sess == nil || len(pending) == 0 {
		return 0, nil
	}
	n := 0
	for ; n < len(pending); n++ {
		d := pending[n]
		if err := sess.admit(work, d.Offset); err != nil {
			return n, err
		}
		if sess.kind(d.Offset) == runPlain {
			break
		}
		dctx, release, revoked := com.hold(ctx, d)
		if revoked {
			return n, errLaneRevoked
		}
		res, err := c.handleInPlace(dctx, work, d, sess)
		release()
		if err != nil {
			if ctx.Err() == nil && com.revoked(d) {
				return n, errLaneRevoked
			}
			return n, err // ctx ended
		}
		if !res.Outcome.Acked() {
			return n, fmt.Errorf("idemq/consumer: %s not acked: %s", d.Position, res.Outcome)
		}
		com.done(d)
	}
	if n == len(pending) {
		return n, nil
	}
	return n, sess.admit(work, pending[len(pending)-1].Offset)
}

// laneContext returns the lane context of d (Revocable.LaneContext), nil
// when the source cannot revoke lanes: a pull session starts afresh when it
// ends (laneSession.received).
func (c *committer) laneContext(d Delivery) context.Context {
	if c.rev == nil {
		return nil
	}
	return c.rev.LaneContext(d)
}
