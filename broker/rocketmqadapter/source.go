package rocketmqadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/wire"
)

const (
	// pollWait bounds one Poll of the client inside Fetch, so that Fetch
	// notices Close and a canceled context promptly.
	pollWait = time.Second
	// revokeFlushWait bounds the commit of the completed deliveries of the
	// queues a rebalance takes away, before the client gives them up.
	revokeFlushWait = 5 * time.Second
	// drainQuiet and drainMax bound how Close drains the client before its
	// Shutdown: until no request came for drainQuiet, at most drainMax.
	drainQuiet = 300 * time.Millisecond
	drainMax   = 5 * time.Second
)

// AddedQueueBound is the longest a Source or a PushConsumer takes to
// consume a queue added to its topic (read queue count raised): the
// client's route refresh interval (30s) plus its rebalance interval (20s),
// both fixed in rocketmq-client-go. See the package documentation,
// "Clients and topics".
const AddedQueueBound = 50 * time.Second

// SourceConfig configures a Source. The zero value of every optional field
// means the default given in its comment.
type SourceConfig struct {
	// NameServers are the NameServer addresses ("127.0.0.1:9876"), resolved
	// with a passthrough resolver. Required.
	NameServers []string
	// Group is the consumer group (clustering mode). Required; letters,
	// digits, '_', '-', '%' and '|', at most 255 bytes.
	Group string
	// Topic is the subscribed topic; it must exist before the first Fetch
	// (see EnsureTopic). Required.
	Topic string
	// Selector filters the topic's messages. Default: every tag (TAG
	// expression "*").
	Selector rmqconsumer.MessageSelector
	// InstanceName is the client's instance name, which must differ between
	// clients of one process. Default: InstanceName("idemq-pull-" + Group).
	InstanceName string
	// MessageIDProperty names the user property holding the message ID.
	// Default wire.MessageIDHeader ("message-id").
	MessageIDProperty string
	// Strategy allocates the group's queues among its members. Default
	// rmqconsumer.AllocateByAveragely (the client's default). The Source
	// wraps it: before a rebalance takes queues away, the deliveries
	// completed on them are committed (consumer.Revocable).
	Strategy rmqconsumer.AllocateStrategy
	// Credentials sign every request of the client and the Source's own
	// admin requests for an ACL-enabled broker (see Config.Credentials).
	// Default none. With an access key, the first Fetch sends one signed
	// request to every master broker of Topic before the client starts and
	// returns an error wrapping ErrAccessDenied when a broker refuses it.
	Credentials primitive.Credentials
	// FileReservedTime is the brokers' fileReservedTime (see
	// Config.FileReservedTime). Default 0: RedeliveryHorizon reads it from
	// every master broker of Topic (admin permission under ACL). When set
	// (at least 1h), the horizon is FileReservedTime + DefaultCleanupGap.
	FileReservedTime time.Duration
	// AcceptOffsetResetReplays states that the operator accepts the risk of
	// offset resets and replays older than SucceededRetention (see
	// Config.AcceptOffsetResetReplays). RedeliveryHorizon is then 1 minute:
	// the Source never sends a message back, so only deliveries done and
	// not yet committed are replayed after a crash. Default false.
	AcceptOffsetResetReplays bool
	// ClientOptions are extra rocketmq-client-go consumer options (e.g.
	// WithConsumeFromWhere, WithPullBatchSize). They are
	// applied before the Source's own options (group, passthrough resolver,
	// instance name, clustering mode, strategy), which win.
	ClientOptions []rmqconsumer.Option
	// Logger receives a warning when the client fails to persist offsets.
	// Default slog.Default().
	Logger *slog.Logger
}

// Source is a consumer.Source over rocketmq-client-go's pull consumer in
// clustering mode (rocketmq.NewPullConsumer, Subscribe, Poll, ACK): the
// group's rebalances assign queues as for a push consumer, and idemq owns
// the committed offsets, as for Kafka: a queue's offset is the end of the
// contiguous prefix of deliveries consumer.Run completed, it never moves
// back, and it is written to the broker at every Commit and on Close. Lanes
// are queues ("<topic>/<brokerName>/<queueId>"), handled in order; retries
// happen in place (consumer.Config RetryInitial/RetryMax) and dead letters go
// to Postgres: nothing is ever sent back to %RETRY%<group>.
//
// It exists because the pinned client loses the offsets a push consumer
// keeps across a rebalance (see the package documentation, "Progress across
// rebalances"): at every Commit the Source records the offset of every queue
// it still owns again, so a rebalance that wiped them from the client's
// table costs nothing. Fetch, Commit and Close may be called from different
// goroutines.
type Source struct {
	cfg SourceConfig
	log *slog.Logger
	pc  rocketmq.PullConsumer

	fetchMu sync.Mutex // Fetch is not called concurrently; guards buf
	buf     []*primitive.MessageExt
	bufReq  *rmqconsumer.ConsumeRequest
	bufCtx  context.Context

	commitMu sync.Mutex // one Commit (or Close) at a time

	mu          sync.Mutex
	clientState // under mu
	queues      map[primitive.MessageQueue]*pullQueue
	flush       func(context.Context) // consumer.Revocable.OnRevoke
}

// processQueue is what the Source uses of the client's process queue (an
// unexported type with exported methods).
type processQueue interface {
	IsDroppd() bool
	WithDropped(bool)
}

// pullQueue is the Source's state of one queue.
type pullQueue struct {
	pq      processQueue       // the client's process queue of the last request polled
	ctx     context.Context    // ends when the queue is taken away from this ownership (pq)
	revoke  context.CancelFunc // ends ctx
	pending []pendingRequest   // requests polled and not yet acknowledged, in offset order
	next    int64              // offset of the next message to consume, as committed; -1: none yet
}

// pendingRequest is one polled request of the client and its last offset.
type pendingRequest struct {
	cr   *rmqconsumer.ConsumeRequest
	last int64
}

// pullAck is the Ack of a delivery from a Source.
type pullAck struct {
	mq  primitive.MessageQueue
	ctx context.Context // the queue's ownership when the delivery was polled
}

// NewSource validates cfg and builds the client and its subscription. It
// does not connect: the first Fetch does. Errors wrap ErrInvalidConfig, or
// come from the client.
func NewSource(cfg SourceConfig) (*Source, error) {
	switch {
	case len(cfg.NameServers) == 0:
		return nil, fmt.Errorf("%w: NameServers is required", ErrInvalidConfig)
	case cfg.Group == "":
		return nil, fmt.Errorf("%w: Group is required", ErrInvalidConfig)
	case cfg.Topic == "":
		return nil, fmt.Errorf("%w: Topic is required", ErrInvalidConfig)
	case strings.TrimSpace(cfg.MessageIDProperty) != cfg.MessageIDProperty:
		return nil, fmt.Errorf("%w: MessageIDProperty %q has surrounding spaces", ErrInvalidConfig, cfg.MessageIDProperty)
	}
	if err := cfg.retention().validate(); err != nil {
		return nil, err
	}
	if err := validateCredentials(cfg.Credentials); err != nil {
		return nil, err
	}
	if cfg.Selector.Type == "" && cfg.Selector.Expression == "" {
		cfg.Selector = rmqconsumer.MessageSelector{Type: rmqconsumer.TAG, Expression: "*"}
	}
	if cfg.InstanceName == "" {
		cfg.InstanceName = InstanceName("idemq-pull-" + cfg.Group)
	}
	if cfg.MessageIDProperty == "" {
		cfg.MessageIDProperty = wire.MessageIDHeader
	}
	if cfg.Strategy == nil {
		cfg.Strategy = rmqconsumer.AllocateByAveragely
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Source{cfg: cfg, log: log.With("adapter", "rocketmq", "group", cfg.Group), queues: map[primitive.MessageQueue]*pullQueue{}}
	opts := append([]rmqconsumer.Option(nil), cfg.ClientOptions...)
	opts = append(opts,
		rmqconsumer.WithGroupName(cfg.Group),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(cfg.NameServers)),
		rmqconsumer.WithInstance(cfg.InstanceName),
		rmqconsumer.WithConsumerModel(rmqconsumer.Clustering),
		rmqconsumer.WithStrategy(s.allocate),
	)
	if cfg.Credentials.AccessKey != "" {
		opts = append(opts, rmqconsumer.WithCredentials(cfg.Credentials))
	}
	pc, err := rocketmq.NewPullConsumer(opts...)
	if err != nil {
		return nil, fmt.Errorf("idemq/rocketmqadapter: new pull consumer: %w", err)
	}
	if err := pc.Subscribe(cfg.Topic, cfg.Selector); err != nil {
		// Not started: the client's Shutdown would dereference state that
		// only Start creates.
		return nil, fmt.Errorf("idemq/rocketmqadapter: subscribe %s: %w", cfg.Topic, err)
	}
	s.pc = pc
	return s, nil
}

// allocate is the client's allocation strategy: cfg.Strategy, and before
// queues of this member are taken away, their lanes are revoked (deliveries
// not started are dropped) and the deliveries completed on them committed,
// so the client gives them up at their latest offset.
func (s *Source) allocate(group, cid string, mqAll []*primitive.MessageQueue, cidAll []string) []*primitive.MessageQueue {
	got := s.cfg.Strategy(group, cid, mqAll, cidAll)
	if len(mqAll) == 0 {
		return got
	}
	topic := mqAll[0].Topic
	keep := make(map[primitive.MessageQueue]bool, len(got))
	for _, mq := range got {
		keep[*mq] = true
	}
	s.mu.Lock()
	var revoked []context.CancelFunc
	for mq, q := range s.queues {
		if mq.Topic == topic && !keep[mq] && q.ctx.Err() == nil && !q.pq.IsDroppd() {
			revoked = append(revoked, q.revoke)
		}
	}
	flush := s.flush
	s.mu.Unlock()
	if len(revoked) == 0 {
		return got
	}
	for _, cancel := range revoked {
		cancel()
	}
	if flush != nil {
		ctx, cancel := context.WithTimeout(context.Background(), revokeFlushWait)
		flush(ctx)
		cancel()
	}
	return got
}

// OnRevoke implements consumer.Revocable: flush is called before a
// rebalance takes queues away from this member.
func (s *Source) OnRevoke(flush func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flush = flush
}

// LaneContext implements consumer.Revocable: the context of d's queue
// ownership, which ends when a rebalance takes the queue away.
func (s *Source) LaneContext(d consumer.Delivery) context.Context {
	if a, ok := d.Ack.(pullAck); ok {
		return a.ctx
	}
	return nil
}

// InstanceName returns the client's instance name.
func (s *Source) InstanceName() string { return s.cfg.InstanceName }

// retention returns cfg's store-retention settings.
func (cfg SourceConfig) retention() retention {
	return retention{fileReservedTime: cfg.FileReservedTime, acceptResets: cfg.AcceptOffsetResetReplays}
}

// RedeliveryHorizon implements consumer.HorizonReporter, which consumer.Run
// checks against the store's SucceededRetention before the first Fetch:
// the Source never sends a message back to %RETRY%, so the broker hands a
// message out again only after an offset reset or a replay, for as long as
// it stores it: FileReservedTime + DefaultCleanupGap when configured, else
// the largest StoreRetention.Horizon of the master brokers of Topic
// (ReadStoreRetention, signed with Credentials); 1 minute under
// AcceptOffsetResetReplays. Errors are ReadStoreRetention's.
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	h, err := s.cfg.retention().storeHorizon(ctx, s.cfg.NameServers, s.cfg.Topic, s.cfg.Credentials)
	if err != nil {
		return 0, fmt.Errorf("idemq/rocketmqadapter: redelivery horizon of pull consumer group %s on topic %s: %w", s.cfg.Group, s.cfg.Topic, err)
	}
	if h == 0 {
		h = crashReplayHorizon
	}
	return h, nil
}

// start starts the client once, after probing the credentials (see
// SourceConfig.Credentials).
func (s *Source) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped && s.err == nil && !s.started && s.cfg.Credentials.AccessKey != "" {
		ctx, cancel := context.WithTimeout(context.Background(), startCheckTimeout)
		err := probeAccess(ctx, s.cfg.NameServers, s.cfg.Topic, s.cfg.Group, s.cfg.Credentials)
		cancel()
		if err != nil {
			s.err = err
			return err
		}
	}
	return s.clientState.start(io.EOF, s.pc.Start, "pull consumer group "+s.cfg.Group+" on topic "+s.cfg.Topic)
}

// Fetch implements consumer.Source: the next message of a queue this member
// owns. The first call starts the client (joins the group). Messages of a
// queue the client has given up since they were polled are dropped here. It
// returns ctx's error when ctx ends, and io.EOF once the Source is closed.
func (s *Source) Fetch(ctx context.Context) (consumer.Delivery, error) {
	if err := s.start(); err != nil {
		return consumer.Delivery{}, err
	}
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return consumer.Delivery{}, err
		}
		if len(s.buf) > 0 && (s.bufReq.GetPQ().IsDroppd() || s.bufCtx.Err() != nil) {
			s.buf = nil // the queue was given up: its next owner reads it from the committed offset
		}
		if len(s.buf) > 0 {
			m := s.buf[0]
			s.buf = s.buf[1:]
			mq := *s.bufReq.GetMQ()
			d := toDelivery(m, &mq, s.cfg.MessageIDProperty)
			d.Ack = pullAck{mq: mq, ctx: s.bufCtx}
			return d, nil
		}
		s.mu.Lock()
		closed := s.stopped
		s.mu.Unlock()
		if closed {
			return consumer.Delivery{}, io.EOF
		}
		cr, err := s.pc.Poll(ctx, pollWait)
		if err != nil {
			if ctx.Err() != nil {
				return consumer.Delivery{}, ctx.Err()
			}
			if rmqconsumer.IsNoNewMsgError(err) {
				continue
			}
			return consumer.Delivery{}, fmt.Errorf("idemq/rocketmqadapter: poll: %w", err)
		}
		msgs := cr.GetMsgList()
		if len(msgs) == 0 || cr.GetMQ() == nil {
			continue
		}
		s.buf, s.bufReq, s.bufCtx = msgs, cr, s.track(cr, msgs[len(msgs)-1].QueueOffset)
	}
}

// track records a polled request as pending acknowledgement and returns the
// context of its queue's ownership.
func (s *Source) track(cr *rmqconsumer.ConsumeRequest, last int64) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	mq := *cr.GetMQ()
	q := s.queues[mq]
	if q == nil {
		q = &pullQueue{next: -1}
		s.queues[mq] = q
	}
	if pq := cr.GetPQ(); q.pq != pq {
		// A new ownership of the queue: the requests of the earlier one were
		// dropped by the client, and its lane context ends.
		if q.revoke != nil {
			q.revoke()
		}
		q.pq, q.pending = pq, nil
		q.ctx, q.revoke = context.WithCancel(context.Background())
	}
	q.pending = append(q.pending, pendingRequest{cr: cr, last: last})
	return q.ctx
}

// Commit implements consumer.Source: for each delivery, it and every earlier
// one of its queue are done, so the queue's offset becomes its offset + 1
// (never lower than before). The client's requests wholly covered are
// acknowledged (ACK with ConsumeSuccess, which frees the client's process
// queue), then the offset of every queue still owned is recorded in the
// client again and written to the broker (PersistOffset).
func (s *Source) Commit(ctx context.Context, done []consumer.Delivery) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	var acks []*rmqconsumer.ConsumeRequest
	s.mu.Lock()
	if s.stopped || !s.started {
		s.mu.Unlock()
		return nil
	}
	for _, d := range done {
		a, ok := d.Ack.(pullAck)
		if !ok {
			continue
		}
		q := s.queues[a.mq]
		if q == nil {
			continue
		}
		if d.Offset+1 > q.next {
			q.next = d.Offset + 1
		}
		k := 0
		for k < len(q.pending) && q.pending[k].last <= d.Offset {
			acks = append(acks, q.pending[k].cr)
			k++
		}
		q.pending = q.pending[k:]
	}
	s.mu.Unlock()
	for _, cr := range acks {
		s.pc.ACK(ctx, cr, rmqconsumer.ConsumeSuccess)
	}
	return s.persist(ctx)
}

// persist records the committed offset of every owned queue in the client
// again (a rebalance may have wiped it from the client's table) and has the
// client write them to the broker.
func (s *Source) persist(ctx context.Context) error {
	s.mu.Lock()
	for mq, q := range s.queues {
		if q.next < 0 || q.pq == nil || q.pq.IsDroppd() {
			continue
		}
		mq := mq
		if err := s.pc.UpdateOffset(&mq, q.next); err != nil {
			s.mu.Unlock()
			return fmt.Errorf("idemq/rocketmqadapter: record offset %d of %s: %w", q.next, mq.String(), err)
		}
	}
	s.mu.Unlock()
	if err := s.pc.PersistOffset(ctx, s.cfg.Topic); err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: persist offsets of group %s: %w", s.cfg.Group, err)
	}
	return nil
}

// drain stops the client's pulls and takes (and discards, unacknowledged)
// the requests it has pulled already, before Shutdown: the client's Shutdown
// closes the channel its pull goroutines send pulled messages on, and a send
// not yet received races that close (a data race, or a panic when the send
// is blocked). Unsubscribing stops new pulls; the requests in flight are
// taken until none came for drainQuiet (at most drainMax).
func (s *Source) drain() {
	_ = s.pc.Unsubscribe(s.cfg.Topic)
	_ = s.pc.Unsubscribe(RetryTopicPrefix + s.cfg.Group)
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	s.buf, s.bufReq, s.bufCtx = nil, nil, nil
	for deadline := time.Now().Add(drainMax); time.Now().Before(deadline); {
		if _, err := s.pc.Poll(context.Background(), drainQuiet); err != nil {
			return
		}
	}
}

// Offsets returns the offset this Source committed per queue it owns (the
// offset of the next message to consume), for tests and status pages.
func (s *Source) Offsets() map[primitive.MessageQueue]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[primitive.MessageQueue]int64{}
	for mq, q := range s.queues {
		if q.next >= 0 && q.pq != nil && !q.pq.IsDroppd() {
			out[mq] = q.next
		}
	}
	return out
}

// Close implements consumer.Source: it records the committed offsets once
// more and shuts the client down, which writes them to the broker and leaves
// the group. Fetch then returns io.EOF. Safe to call more than once.
func (s *Source) Close() error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	started := s.started
	s.mu.Unlock()
	var perr error
	if started {
		perr = s.persist(context.Background())
	}
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	if started {
		s.drain()
	}
	s.mu.Lock()
	for _, q := range s.queues {
		if q.pq != nil {
			q.pq.WithDropped(true)
		}
		if q.revoke != nil {
			q.revoke()
		}
	}
	s.mu.Unlock()
	if perr != nil {
		s.log.Warn("idemq: persist offsets before shutdown", "err", perr)
	}
	if !started {
		return nil // the client's Shutdown needs a started client
	}
	if err := s.pc.Shutdown(); err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: shutdown pull consumer: %w", errors.Join(err, perr))
	}
	return nil
}

var (
	_ consumer.Source          = (*Source)(nil)
	_ consumer.Revocable       = (*Source)(nil)
	_ consumer.HorizonReporter = (*Source)(nil)
)
