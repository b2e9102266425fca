package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/segmentio/kafka-go"
)

// DefaultMessageIDHeader is the header carrying the message ID, also written
// by idemq's outbox relay.
const DefaultMessageIDHeader = "message-id"

// Config configures a Source.
type Config struct {
	// Reader configures the kafka-go consumer-group Reader. Brokers and
	// GroupID are required, with Topic or GroupTopics. CommitInterval must be
	// 0 (the default): idemq batches commits itself
	// (consumer.Config.CommitEvery, consumer.Config.CommitInterval). Other fields keep kafka-go's defaults
	// (SessionTimeout 30s; it must be at least the broker's
	// group.min.session.timeout.ms, 6s by default).
	Reader kafka.ReaderConfig
	// MessageIDHeader names the header holding the message ID. Default
	// "message-id".
	MessageIDHeader string
	// FetchRetryMax caps the wait between fetch attempts after a transient
	// error (see Source.Fetch); waits start at 100ms and double. Default
	// 30s; it must not be negative.
	FetchRetryMax time.Duration
	// Logger receives a warning for each transient fetch error. Default
	// slog.Default().
	Logger *slog.Logger
}

// Source is a consumer.Source over a kafka-go consumer-group Reader.
type Source struct {
	r        *kafka.Reader
	fetch    func(context.Context) (kafka.Message, error) // r.FetchMessage; replaced in tests
	hdr      string
	retryMax time.Duration
	log      *slog.Logger
}

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/kafkaadapter: invalid config")

// NewSource validates cfg and opens a Reader. Errors wrap ErrInvalidConfig.
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
	}
	if err := rc.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	hdr := cfg.MessageIDHeader
	if hdr == "" {
		hdr = DefaultMessageIDHeader
	}
	s := &Source{r: kafka.NewReader(rc), hdr: hdr, retryMax: cfg.FetchRetryMax, log: cfg.Logger}
	s.fetch = s.r.FetchMessage
	if s.retryMax == 0 {
		s.retryMax = 30 * time.Second
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s, nil
}

// RedeliveryHorizon implements consumer.HorizonReporter: the largest
// retention.ms of the Reader's topics (0 when one is unbounded, -1).
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	cfg := s.r.Config()
	topics := cfg.GroupTopics
	if cfg.Topic != "" {
		topics = append([]string{cfg.Topic}, topics...)
	}
	var horizon time.Duration
	for _, t := range topics {
		d, err := TopicRetention(ctx, cfg.Brokers, t)
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

// Reader returns the underlying kafka-go Reader (for Stats, Lag).
func (s *Source) Reader() *kafka.Reader { return s.r }

// Fetch implements consumer.Source with Reader.FetchMessage.
//
// kafka-go's Reader keeps fetching after it reports an error: it hands
// FetchMessage a partition's read errors, group errors (a rebalance in
// progress, a coordinator moving) and, after ReaderConfig.MaxAttempts failed
// connection attempts, the connection error, then goes on retrying by
// itself. So Fetch logs such errors (Logger, warning) and calls FetchMessage
// again after a backoff of 100ms doubling up to FetchRetryMax, and a broker
// restart or a leader move does not stop the consumer. It returns ctx's
// error when ctx ends, io.EOF once the Reader is closed, and at once a Kafka
// error a retry cannot fix (authorization, authentication, unsupported
// version, invalid group or topic) or an error that is neither a Kafka
// error nor a network error.
func (s *Source) Fetch(ctx context.Context) (consumer.Delivery, error) {
	var b *backoff.ExponentialBackOff
	for {
		m, err := s.fetch(ctx)
		if err == nil {
			return ToDelivery(m, s.hdr), nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return consumer.Delivery{}, cerr
		}
		if !fetchRetriable(err) {
			return consumer.Delivery{}, err
		}
		if b == nil {
			b = &backoff.ExponentialBackOff{InitialInterval: min(100*time.Millisecond, s.retryMax), RandomizationFactor: 0.2,
				Multiplier: 2, MaxInterval: s.retryMax}
			b.Reset()
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

// fetchRetriable reports whether FetchMessage may succeed if called again:
// yes for a Kafka error code other than the final ones (authorization,
// authentication, unsupported version: a retry cannot fix them) and for a
// network error; no once the Reader is closed (io.EOF) or for an error of
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
			kafka.UnsupportedVersion, kafka.InvalidGroupId, kafka.InvalidTopic:
			return false
		}
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Commit implements consumer.Source with Reader.CommitMessages, which commits
// offset+1 of each message's partition.
func (s *Source) Commit(ctx context.Context, done []consumer.Delivery) error {
	msgs := make([]kafka.Message, 0, len(done))
	for _, d := range done {
		m, ok := d.Ack.(kafka.Message)
		if !ok {
			return fmt.Errorf("idemq/kafkaadapter: delivery %s was not fetched by this adapter", d.Position)
		}
		msgs = append(msgs, m)
	}
	return s.r.CommitMessages(ctx, msgs...)
}

// Close implements consumer.Source; it closes the Reader (leaving the group).
func (s *Source) Close() error { return s.r.Close() }

// Position is the position identity of a Kafka message:
// "kafka:<topic>/<partition>/<offset>".
func Position(topic string, partition int, offset int64) string {
	return "kafka:" + topic + "/" + strconv.Itoa(partition) + "/" + strconv.FormatInt(offset, 10)
}

// ToDelivery converts a fetched kafka-go message. header names the message-ID
// header ("" means DefaultMessageIDHeader); the last value of a repeated
// header wins.
func ToDelivery(m kafka.Message, header string) consumer.Delivery {
	if header == "" {
		header = DefaultMessageIDHeader
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
	// A blank header ("", " ", "\t" …) is no message ID (dedup.IsBlank): the
	// position identity applies, so blank-header messages never share one.
	id := headers[header]
	if dedup.IsBlank(id) {
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
