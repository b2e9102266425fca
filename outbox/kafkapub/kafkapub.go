package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/internal/kafkaadmin"
	"github.com/idemq/idemq/outbox"
	"github.com/segmentio/kafka-go"
)

// Config configures a Publisher. Every zero value but Brokers means the
// default in the field's comment.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port"). Required.
	Brokers []string
	// Transport carries the TLS and SASL settings of every connection the
	// Publisher makes: produce requests, the metadata (partition) lookups
	// and, with CreateTopics, topic creation. Build it with
	// kafkasec.Config.Transport (a nil interface when PLAINTEXT). Default
	// kafka.DefaultTransport (PLAINTEXT). The principal needs the Write and
	// Describe ACLs on the topics (and Create on them, or on the cluster,
	// with CreateTopics). A refused login or a security-protocol mismatch
	// fails with an error wrapping kafkasec.ErrAuthentication or
	// kafkasec.ErrSecurityMismatch.
	Transport kafka.RoundTripper
	// Balancer maps keys to partitions. Default kafka.Murmur2Balancer{}
	// (Java-compatible; rows without a key go to a random partition). It
	// must send equal keys to one partition, or per-key order is lost.
	Balancer kafka.Balancer
	// BatchBytes caps one produce request (one record batch), in bytes of
	// keys, values and headers plus an estimated 40 bytes per record. A row
	// larger than this fails with ErrTooLarge (and is parked after
	// RelayConfig.MaxAttempts). Default 1,000,000, under Kafka's default
	// message.max.bytes (1048588); at least 1024.
	BatchBytes int
	// WriteTimeout bounds one produce request (the relay's
	// RelayConfig.PublishTimeout bounds the whole call). Default 10s.
	WriteTimeout time.Duration
	// Compression of produce requests. Default none.
	Compression kafka.Compression
	// CreateTopics creates a topic (TopicPartitions partitions, replication
	// factor 1) before the first publish to it, as
	// kafkaadapter.EnsureTopics does (same code). Default false: publishing to a missing
	// topic fails, and its rows retry until an operator creates it.
	CreateTopics bool
	// TopicPartitions is the partition count of topics made by
	// CreateTopics. Default 1.
	TopicPartitions int
	// MetadataTTL is how long a topic's partition count is cached. Default
	// 10s. A failed produce drops the topic from the cache.
	MetadataTTL time.Duration
}

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/kafkapub: invalid config")

// ErrTooLarge is the error of a row whose record alone exceeds
// Config.BatchBytes.
var ErrTooLarge = errors.New("idemq/kafkapub: record larger than BatchBytes")

// Publisher publishes outbox envelopes with kafka-go produce requests. It is
// safe for concurrent use.
type Publisher struct {
	cl  *kafka.Client
	cfg Config

	mu    sync.Mutex
	parts map[string]topicParts

	send func(ctx context.Context, k tp, recs []pos) error // produce; replaced in tests
}

type topicParts struct {
	ids     []int
	fetched time.Time
}

// New validates cfg and returns a Publisher. It does not connect: the first
// publish does. Errors wrap ErrInvalidConfig.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: Brokers is required", ErrInvalidConfig)
	}
	if cfg.Balancer == nil {
		cfg.Balancer = kafka.Murmur2Balancer{}
	}
	if cfg.BatchBytes == 0 {
		cfg.BatchBytes = 1_000_000
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.TopicPartitions == 0 {
		cfg.TopicPartitions = 1
	}
	if cfg.MetadataTTL == 0 {
		cfg.MetadataTTL = 10 * time.Second
	}
	switch {
	case cfg.BatchBytes < 1024:
		return nil, fmt.Errorf("%w: BatchBytes %d must be at least 1024", ErrInvalidConfig, cfg.BatchBytes)
	case cfg.WriteTimeout < 0 || cfg.MetadataTTL < 0:
		return nil, fmt.Errorf("%w: WriteTimeout %s and MetadataTTL %s must not be negative", ErrInvalidConfig, cfg.WriteTimeout, cfg.MetadataTTL)
	case cfg.TopicPartitions < 1:
		return nil, fmt.Errorf("%w: TopicPartitions %d must be at least 1", ErrInvalidConfig, cfg.TopicPartitions)
	}
	cl := &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: cfg.WriteTimeout, Transport: cfg.Transport}
	p := &Publisher{cl: cl, cfg: cfg, parts: map[string]topicParts{}}
	p.send = p.produce
	return p, nil
}

// Config returns the configuration with defaults applied.
func (p *Publisher) Config() Config { return p.cfg }

// Close releases nothing today (connections belong to the Transport); it is
// here so a Publisher can be closed like the other publishers.
func (p *Publisher) Close() error { return nil }

// Message converts an envelope to the kafka-go message a row becomes: topic,
// key, value, and the headers sorted by name.
func Message(e outbox.Envelope) kafka.Message {
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	hs := make([]kafka.Header, len(names))
	for i, k := range names {
		hs[i] = kafka.Header{Key: k, Value: []byte(e.Headers[k])}
	}
	return kafka.Message{Topic: e.Topic, Key: e.Key, Value: e.Payload, Headers: hs}
}

// Publish implements outbox.Publisher: each envelope is a chain of one (see
// PublishChains). It returns nil or outbox.PublishErrors.
func (p *Publisher) Publish(ctx context.Context, batch []outbox.Envelope) error {
	chains := make([][]outbox.Envelope, len(batch))
	for i := range batch {
		chains[i] = batch[i : i+1]
	}
	res := p.PublishChains(ctx, chains)
	errs := make(outbox.PublishErrors, len(batch))
	failed := false
	for i, r := range res {
		if r.Acked < 1 {
			errs[i], failed = r.Err, true
		}
	}
	if failed {
		return errs
	}
	return nil
}

// PublishChains implements outbox.ChainPublisher. The records of all chains
// are grouped by topic and partition (a chain's rows share a key, so they
// share a partition); each partition's records, in chain order, go in as few
// produce requests as Config.BatchBytes allows, sent one after the other;
// partitions are written in parallel. A record batch is appended atomically,
// and a chain's records after a failed request are not sent, so the stored
// rows of a chain are always a prefix of it. A request that fails with a row
// error (not outbox.IsUnavailable: a record too large, an invalid record)
// is sent again one chain at a time, so a refused row fails only its own
// chain, never the other keys that share its partition.
func (p *Publisher) PublishChains(ctx context.Context, chains [][]outbox.Envelope) []outbox.ChainResult {
	res := make([]outbox.ChainResult, len(chains))
	placeErr := make([]error, len(chains))
	limit := make([]int, len(chains)) // envelopes placed, a prefix of the chain
	parts := map[string][]int{}       // one partition list per topic per call
	partErr := map[string]error{}     // why a topic has no partition list
	groups := map[tp][]pos{}
	var order []tp
	for c, chain := range chains {
		for i, e := range chain {
			ids, ok := parts[e.Topic]
			if !ok {
				var err error
				if ids, err = p.partitions(ctx, e.Topic); err != nil {
					ids = nil
					partErr[e.Topic] = err
				}
				parts[e.Topic] = ids
			}
			if ids == nil {
				// Every chain of the topic gets the lookup's error (an
				// unavailable broker stays unavailable for all of them).
				placeErr[c] = partErr[e.Topic]
				if placeErr[c] == nil {
					placeErr[c] = fmt.Errorf("idemq/kafkapub: topic %s: no partitions", e.Topic)
				}
				break
			}
			k := tp{e.Topic, p.cfg.Balancer.Balance(kafka.Message{Topic: e.Topic, Key: e.Key}, ids...)}
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], pos{chain: c, idx: i, msg: Message(e)})
			limit[c] = i + 1
		}
	}
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.writePartition(ctx, k, groups[k], res)
		}()
	}
	wg.Wait()
	for c := range chains {
		if res[c].Err == nil && res[c].Acked == limit[c] && limit[c] < len(chains[c]) {
			res[c].Err = placeErr[c]
		}
	}
	return res
}

type tp struct {
	topic     string
	partition int
}

// pos is one envelope of a chain, placed in a partition.
type pos struct {
	chain, idx int
	msg        kafka.Message
}

// writePartition sends one partition's records in requests of at most
// BatchBytes, one after the other, leaving out the records of chains that
// already failed, and counts per chain the leading envelopes acked. Only this
// goroutine touches the results of the chains placed in this partition.
func (p *Publisher) writePartition(ctx context.Context, k tp, ps []pos, res []outbox.ChainResult) {
	for _, req := range splitRequests(ps, p.cfg.BatchBytes) {
		var send []pos
		for _, q := range req {
			if res[q.chain].Err == nil {
				send = append(send, q)
			}
		}
		if len(send) == 0 {
			continue
		}
		var err error
		if n := recordSize(send[0].msg); len(send) == 1 && n > p.cfg.BatchBytes {
			err = fmt.Errorf("%w: %d bytes > %d (topic %s)", ErrTooLarge, n, p.cfg.BatchBytes, k.topic)
		} else {
			err = p.send(ctx, k, send)
		}
		if err != nil && !outbox.IsUnavailable(err) && ctx.Err() == nil && !oneChain(send) {
			// A row error (a record refused) fails the whole request, whose
			// record batch is appended all or nothing: send each chain's
			// records of it alone, so only the refused row's chain fails and
			// the other keys of the partition are not charged an attempt.
			for _, group := range byChain(send) {
				settle(res, group, p.send(ctx, k, group))
			}
			continue
		}
		settle(res, send, err)
	}
}

// settle records the outcome of one request: every record's chain gets err,
// or one more envelope acked.
func settle(res []outbox.ChainResult, send []pos, err error) {
	for _, q := range send {
		if err != nil {
			res[q.chain].Err = err
		} else {
			res[q.chain].Acked++
		}
	}
}

// oneChain reports whether every record of send belongs to one chain.
func oneChain(send []pos) bool {
	for _, q := range send {
		if q.chain != send[0].chain {
			return false
		}
	}
	return true
}

// byChain groups the records of send by chain, keeping their order, the
// chains in the order of their first record.
func byChain(send []pos) [][]pos {
	var out [][]pos
	at := map[int]int{}
	for _, q := range send {
		i, ok := at[q.chain]
		if !ok {
			i = len(out)
			at[q.chain] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], q)
	}
	return out
}

// splitRequests cuts one partition's records into requests of at most
// maxBytes (a record larger than maxBytes travels alone and fails).
func splitRequests(ps []pos, maxBytes int) [][]pos {
	var out [][]pos
	var cur []pos
	size := 0
	for _, q := range ps {
		n := recordSize(q.msg)
		if len(cur) > 0 && size+n > maxBytes {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, q)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// recordSize estimates the bytes a record takes in a record batch.
func recordSize(m kafka.Message) int {
	n := 40 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 8 + len(h.Key) + len(h.Value)
	}
	return n
}

func (p *Publisher) produce(ctx context.Context, k tp, send []pos) error {
	recs := make([]kafka.Record, len(send))
	for i, q := range send {
		recs[i] = kafka.Record{Key: kafka.NewBytes(q.msg.Key), Value: kafka.NewBytes(q.msg.Value), Headers: q.msg.Headers}
	}
	resp, err := p.cl.Produce(ctx, &kafka.ProduceRequest{Topic: k.topic, Partition: k.partition,
		RequiredAcks: kafka.RequireAll, Compression: p.cfg.Compression, Records: kafka.NewRecordReader(recs...)})
	if err == nil && resp != nil && resp.Error != nil {
		err = resp.Error
	}
	if err == nil && resp != nil {
		for _, rerr := range resp.RecordErrors {
			if rerr != nil {
				err = rerr
				break
			}
		}
	}
	if err != nil {
		p.forget(k.topic)
		return classify(fmt.Errorf("idemq/kafkapub: produce %s/%d: %w", k.topic, k.partition, kafkasec.Explain(err)))
	}
	return nil
}

func (p *Publisher) partitions(ctx context.Context, topic string) ([]int, error) {
	p.mu.Lock()
	tp, ok := p.parts[topic]
	p.mu.Unlock()
	if ok && time.Since(tp.fetched) < p.cfg.MetadataTTL {
		return tp.ids, nil
	}
	if p.cfg.CreateTopics && !ok {
		if err := kafkaadmin.EnsureTopics(ctx, p.cfg.Transport, p.cfg.Brokers, p.cfg.TopicPartitions, topic); err != nil {
			return nil, classify(err)
		}
	}
	md, err := p.cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, classify(fmt.Errorf("idemq/kafkapub: metadata of %s: %w", topic, kafkasec.Explain(err)))
	}
	var ids []int
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, classify(fmt.Errorf("idemq/kafkapub: topic %s: %w", topic, t.Error))
		}
		for _, pt := range t.Partitions {
			ids = append(ids, pt.ID)
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("idemq/kafkapub: topic %s: %w", topic, kafka.UnknownTopicOrPartition)
	}
	sort.Ints(ids)
	p.mu.Lock()
	p.parts[topic] = topicParts{ids: ids, fetched: time.Now()}
	p.mu.Unlock()
	return ids, nil
}

func (p *Publisher) forget(topic string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tp, ok := p.parts[topic]; ok {
		tp.fetched = time.Time{}
		p.parts[topic] = tp
	}
}
