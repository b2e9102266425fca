package kafkaadapter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
	"github.com/segmentio/kafka-go"
)

// Config configures a Source.
type Config struct {
	// Reader configures the consumer group and its partition readers, with
	// kafka-go's field meanings and defaults. Brokers and GroupID are
	// required, with Topic or GroupTopics (GroupTopics wins when both are
	// set, as in kafka-go). CommitInterval and Partition must be 0: idemq
	// commits itself (consumer.Config.CommitEvery, CommitInterval), per
	// generation. The group fields (GroupID, the topics, GroupBalancers,
	// HeartbeatInterval, SessionTimeout, RebalanceTimeout, JoinGroupBackoff,
	// RetentionTime, StartOffset) configure a kafka.ConsumerGroup;
	// PartitionWatchInterval sets how often the Source watches for
	// partitions added (see IgnorePartitionChanges; WatchPartitionChanges is
	// redundant, the watch is the default); the fetch fields
	// (MinBytes, MaxBytes, MaxWait, ReadBatchTimeout, ReadBackoffMin,
	// ReadBackoffMax, QueueCapacity, IsolationLevel, MaxAttempts,
	// OffsetOutOfRangeError) configure one partition Reader per assigned
	// partition, so QueueCapacity (default 100) is per partition; Dialer,
	// Logger and ErrorLogger serve both. ReadLagInterval is not used (lag:
	// Source.Stats, GroupLag). SessionTimeout (default 30s) must be at least
	// the broker's group.min.session.timeout.ms (6s by default).
	Reader kafka.ReaderConfig
	// MessageIDHeader names the header holding the message ID. Default
	// wire.MessageIDHeader (message-id), the header idemq's outbox relay
	// writes.
	MessageIDHeader string
	// FetchRetryMax caps the backoff after a transient fetch error (see
	// Source.Fetch): 100ms doubling, per partition for a partition
	// reader's errors (a message read ends it at once and resets it), and
	// for the group's errors in Fetch (reset by a message read). Default
	// 30s; it must not be negative.
	FetchRetryMax time.Duration
	// Logger receives a warning per transient fetch error read while no
	// backoff is in progress (with the topic and partition for a partition
	// reader's), an info line when a failing partition reads again and one
	// per generation joined and given up. Default slog.Default().
	Logger *slog.Logger
	// RedeliveryHorizon, when set, is what Source.RedeliveryHorizon returns
	// without asking the broker: the operator's statement of how far back
	// the consumed topics can be replayed (their largest retention.ms). Set
	// it when the principal lacks the DescribeConfigs ACL on the topics
	// (the check then fails with ErrHorizonCheckDenied). Risk: a value
	// shorter than a topic's real retention.ms lets consumer.Run start with
	// a record retention that does not cover it, so a message replayed
	// after its record expired (an offset reset, a new group) is processed
	// again. Default 0: ask the broker (DescribeConfigs). Must not be
	// negative; there is no way to state an unbounded horizon here (leave
	// it 0 and grant the ACL).
	RedeliveryHorizon time.Duration
	// IgnorePartitionChanges turns off the watch for partitions added to
	// the consumed topics. Default false: every member asks for the topics'
	// partition count (a metadata request through Reader.Dialer) every
	// Reader.PartitionWatchInterval (default DefaultPartitionWatchInterval,
	// 5s) and ends its generation when a count differs from the one read
	// before it joined, so the group rebalances and an added partition is
	// consumed, from its first offset (Reader.StartOffset's default
	// kafka.FirstOffset), within that interval plus one rebalance (bounded
	// by Reader.RebalanceTimeout, default 30s). Set, an added partition is
	// consumed only after the group rebalances for another reason (a member
	// joins or leaves). A topic that does not exist counts 0 partitions: its
	// creation is a change too. Reader.WatchPartitionChanges must not be set
	// with it.
	IgnorePartitionChanges bool
}

// DefaultPartitionWatchInterval is how often a Source asks for the
// partition count of its topics when Reader.PartitionWatchInterval is 0
// (kafka-go's default): a partition added is consumed within it plus one
// rebalance (see Config.IgnorePartitionChanges).
const DefaultPartitionWatchInterval = 5 * time.Second

// Source is a consumer.Source over a kafka-go consumer group, fenced by
// generation (see the package doc): it implements consumer.Revocable and
// consumer.HorizonReporter. Fetch, Commit, Stats and Close may be called
// from different goroutines.
type Source struct {
	rc  kafka.ReaderConfig        // the caller's Reader config
	cgc kafka.ConsumerGroupConfig // the group half of rc
	// flushWait bounds the commit of a generation's completed offsets when
	// it ends: a third of SessionTimeout or RebalanceTimeout, whichever is
	// shorter, so that the member rejoins in time.
	flushWait time.Duration
	hdr       string
	retryMax  time.Duration
	log       *slog.Logger
	horizon   time.Duration      // Config.RedeliveryHorizon
	admin     kafka.RoundTripper // rc.Dialer's TLS/SASL, for the admin requests
	// fetch returns the next message read for a claim, or an error of a
	// partition reader or of the group; s.receive, replaced in tests.
	fetch func(context.Context) (kafka.Message, *claim, error)
	// newReader builds a claim's partition reader: newKafkaReader, replaced
	// in tests.
	newReader func(kafka.ReaderConfig) partitionReader
	// watch is set unless Config.IgnorePartitionChanges: serve ends a
	// generation when the partition count of a consumed topic changes,
	// checked every watchEvery with counts (s.readPartitionCounts, replaced
	// in tests).
	watch      bool
	watchEvery time.Duration
	counts     func(context.Context) (map[string]int, error)

	ctx      context.Context // ends when the Source is closed
	cancel   context.CancelFunc
	msgs     chan fetched // from the partition readers and the group loop
	wg       sync.WaitGroup
	commitMu sync.Mutex // one Commit at a time

	mu         sync.Mutex
	started    bool
	closed     bool
	cg         *kafka.ConsumerGroup
	flush      func(context.Context)      // consumer.Revocable.OnRevoke
	owned      map[topicPartition]*claim  // partitions owned in the generation in hand
	completed  map[topicPartition]int64   // per partition, the highest offset Commit was given
	readers    map[*claim]partitionReader // live partition readers
	stats      Stats                      // the cumulative counters
	retired    kafka.ReaderStats          // stats of the readers stopped since the last Stats call
	rebalances int64                      // generations joined since the last Stats call
	genID      int32                      // the generation in hand, -1 when none
	// base is the partition count per consumed topic read before this
	// member (re)joined the group, for the next generation's watch; nil
	// when it could not be read (the generation reads its own).
	base map[string]int
}

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/kafkaadapter: invalid config")

// NewSource validates cfg and returns a Source. It joins the group at the
// first Fetch. Errors wrap ErrInvalidConfig.
func NewSource(cfg Config) (*Source, error) {
	rc := cfg.Reader
	switch {
	case len(rc.Brokers) == 0:
		return nil, fmt.Errorf("%w: Reader.Brokers is required", ErrInvalidConfig)
	case rc.GroupID == "":
		return nil, fmt.Errorf("%w: Reader.GroupID is required (offsets are committed to the consumer group)", ErrInvalidConfig)
	case rc.Topic == "" && len(rc.GroupTopics) == 0:
		return nil, fmt.Errorf("%w: Reader.Topic or Reader.GroupTopics is required", ErrInvalidConfig)
	case rc.CommitInterval != 0:
		return nil, fmt.Errorf("%w: Reader.CommitInterval %s must be 0; set consumer.Config.CommitInterval instead", ErrInvalidConfig, rc.CommitInterval)
	case rc.Partition != 0:
		return nil, fmt.Errorf("%w: Reader.Partition cannot be used with a consumer group", ErrInvalidConfig)
	case cfg.FetchRetryMax < 0:
		return nil, fmt.Errorf("%w: FetchRetryMax %s must not be negative", ErrInvalidConfig, cfg.FetchRetryMax)
	case cfg.RedeliveryHorizon < 0:
		return nil, fmt.Errorf("%w: RedeliveryHorizon %s must not be negative (0: ask the broker)", ErrInvalidConfig, cfg.RedeliveryHorizon)
	case cfg.IgnorePartitionChanges && rc.WatchPartitionChanges:
		return nil, fmt.Errorf("%w: IgnorePartitionChanges and Reader.WatchPartitionChanges contradict each other (the watch is the default)", ErrInvalidConfig)
	}
	if err := rc.Validate(); err != nil {
		return nil, fmt.Errorf("%w: Reader: %v", ErrInvalidConfig, err)
	}
	if bmin, bmax := cmp.Or(rc.ReadBackoffMin, 100*time.Millisecond), cmp.Or(rc.ReadBackoffMax, time.Second); bmax < bmin {
		return nil, fmt.Errorf("%w: Reader.ReadBackoffMax %s is below Reader.ReadBackoffMin %s (defaults 1s and 100ms)", ErrInvalidConfig, bmax, bmin)
	}
	cgc := groupConfig(rc)
	// The Source watches the partitions itself (serve): kafka-go's watch
	// ends every generation at once while a consumed topic does not exist,
	// and it takes its baseline after the assignment was made.
	cgc.WatchPartitionChanges = false
	check := cgc // Validate fills in defaults
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("%w: Reader: %v", ErrInvalidConfig, err)
	}
	s := &Source{rc: rc, cgc: cgc, flushWait: min(check.SessionTimeout, check.RebalanceTimeout) / 3, hdr: cmp.Or(cfg.MessageIDHeader, wire.MessageIDHeader),
		retryMax: cmp.Or(cfg.FetchRetryMax, 30*time.Second), log: cfg.Logger,
		horizon: cfg.RedeliveryHorizon, admin: kafkasec.TransportFromDialer(rc.Dialer),
		msgs: make(chan fetched), owned: map[topicPartition]*claim{}, completed: map[topicPartition]int64{},
		readers: map[*claim]partitionReader{}, newReader: newKafkaReader, genID: -1}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.fetch = s.receive
	s.watch, s.watchEvery, s.counts = !cfg.IgnorePartitionChanges, cmp.Or(rc.PartitionWatchInterval, DefaultPartitionWatchInterval), s.readPartitionCounts
	return s, nil
}

// topics are the topics rc consumes: GroupTopics, else Topic (kafka-go's
// rule).
func topics(rc kafka.ReaderConfig) []string {
	if len(rc.GroupTopics) > 0 {
		return rc.GroupTopics
	}
	return []string{rc.Topic}
}

// RedeliveryHorizon implements consumer.HorizonReporter: Config.RedeliveryHorizon
// when set, without a request; else the largest retention.ms of the
// consumed topics (0 when one is unbounded, -1), asked with DescribeConfigs
// (TopicRetentionWith) through the Reader's Dialer (its TLS and SASL
// settings; kafkasec.TransportFromDialer). When the broker refuses that
// request for authorization, the error wraps ErrHorizonCheckDenied and
// names the DescribeConfigs ACL and Config.RedeliveryHorizon.
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	if s.horizon > 0 {
		return s.horizon, nil
	}
	var horizon time.Duration
	for _, t := range topics(s.rc) {
		d, err := TopicRetentionWith(ctx, s.admin, s.rc.Brokers, t)
		if err != nil {
			return 0, err
		}
		if d == 0 {
			return 0, nil
		}
		horizon = max(horizon, d)
	}
	return horizon, nil
}

// Fetch implements consumer.Source: the next message of a partition this
// member owns, never committed by fetching (FetchMessage semantics). The
// first call joins the consumer group.
//
// Messages of a partition whose generation ended are dropped here, unread
// by the caller, and so is a message at or below an offset already given to
// Commit (it is done). kafka-go keeps reading after it reports an error:
// the partition readers report read errors and, after
// ReaderConfig.MaxAttempts failed connection attempts, the connection
// error; the group reports join and sync errors (a rebalance in progress, a
// coordinator moving). So such errors are logged (Logger, warning) and
// reading goes on after a backoff of 100ms doubling up to FetchRetryMax,
// and a broker restart or a leader move does not stop the consumer:
//
//   - A partition reader's error is handled by that partition alone: the
//     other partitions are read and fetched meanwhile. While it backs off,
//     the partition still takes what kafka-go read: a message ends the
//     backoff at once (errors kafka-go queued while a broker was down do
//     not each wait a backoff), and further errors are counted in the next
//     warning. A message read resets its backoff to 100ms.
//   - A group error reaches Fetch, which waits its own backoff (kafka-go
//     reports them between generations, when no partition is read); a
//     message read resets it.
//
// It returns ctx's error when ctx ends, io.EOF once the Source is closed,
// and at once a Kafka error a retry cannot fix (authorization,
// authentication, unsupported version, invalid group, topic or session
// timeout) or an error that is neither a Kafka error nor a network error; a
// refused SASL login or a TLS failure is wrapped by kafkasec.Explain
// (kafkasec.ErrAuthentication, kafkasec.ErrSecurityMismatch).
func (s *Source) Fetch(ctx context.Context) (consumer.Delivery, error) {
	if err := s.start(ctx); err != nil {
		return consumer.Delivery{}, err
	}
	var b *backoff.ExponentialBackOff
	for {
		m, c, err := s.fetch(ctx)
		if err == nil {
			if b != nil {
				b.Reset() // a message was read: the next error waits 100ms again
			}
			if d, ok := s.deliver(m, c); ok {
				return d, nil
			}
			continue
		}
		if cerr := ctx.Err(); cerr != nil {
			return consumer.Delivery{}, cerr
		}
		if c != nil && c.ctx.Err() != nil {
			continue // an error of a partition reader that was stopped
		}
		if !fetchRetriable(err) {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
				err = kafkasec.Explain(err) // a refused login, a TLS mismatch: say so
			}
			return consumer.Delivery{}, err
		}
		if b == nil {
			b = s.fetchBackoff()
		}
		wait := b.NextBackOff()
		s.log.Warn("idemq: kafka fetch failed; fetching again", "err", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return consumer.Delivery{}, ctx.Err()
		case <-t.C:
		}
	}
}

// fetchBackoff is the backoff after a retriable fetch error: 100ms (or
// FetchRetryMax when shorter) doubling up to FetchRetryMax, ±20% jitter.
func (s *Source) fetchBackoff() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{InitialInterval: min(100*time.Millisecond, s.retryMax), RandomizationFactor: 0.2,
		Multiplier: 2, MaxInterval: s.retryMax}
	b.Reset()
	return b
}

// fetchRetriable reports whether FetchMessage may succeed if called again:
// yes for a Kafka error code other than the final ones (authorization,
// authentication, unsupported version: a retry cannot fix them) and for a
// network error; no once the Source is closed (io.EOF) or for an error of
// any other kind.
func fetchRetriable(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) {
		return false
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.TopicAuthorizationFailed, kafka.GroupAuthorizationFailed, kafka.ClusterAuthorizationFailed,
			kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState,
			kafka.UnsupportedVersion, kafka.InvalidGroupId, kafka.InvalidTopic, kafka.InvalidSessionTimeout:
			return false
		}
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Position is the position identity of a Kafka message:
// "kafka:<topic>/<partition>/<offset>".
func Position(topic string, partition int, offset int64) string {
	return "kafka:" + topic + "/" + strconv.Itoa(partition) + "/" + strconv.FormatInt(offset, 10)
}

// ToDelivery converts a fetched kafka-go message. header names the message-ID
// header ("" means wire.MessageIDHeader); the last value of a repeated
// header wins.
func ToDelivery(m kafka.Message, header string) consumer.Delivery {
	if header == "" {
		header = wire.MessageIDHeader
	}
	headers := make(map[string]string, len(m.Headers))
	for _, h := range m.Headers {
		headers[h.Key] = string(h.Value)
	}
	pos := Position(m.Topic, m.Partition, m.Offset)
	var t time.Time
	if !m.Time.IsZero() {
		t = m.Time
	}
	// A blank header ("", " ", "\t" …) is no message ID (wire.IsBlank): the
	// position identity applies, so blank-header messages never share one.
	id := headers[header]
	if wire.IsBlank(id) {
		id = ""
	}
	return consumer.Delivery{
		Message: &dedup.Message{
			Topic: m.Topic, Key: m.Key, Payload: m.Value, Headers: headers, Source: pos,
			Partition: m.Partition, Offset: m.Offset, Time: t,
		},
		MessageID: id,
		Position:  pos,
		Lane:      m.Topic + "/" + strconv.Itoa(m.Partition),
		Offset:    m.Offset,
		Ack:       m,
	}
}
