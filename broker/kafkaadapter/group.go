package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/segmentio/kafka-go"
)

// topicPartition names a partition.
type topicPartition struct {
	topic     string
	partition int
}

// offsetCommitter commits offsets with one generation: *kafka.Generation.
type offsetCommitter interface {
	CommitOffsets(offsets map[string]map[int]int64) error
}

// generation is one consumer-group generation this member takes part in.
type generation struct {
	id     int32
	commit offsetCommitter
	// mu is held shared by each commit made with this generation and
	// exclusively to close it, so no commit is in flight once it is closed.
	mu     sync.RWMutex
	closed bool        // under mu: given up; nothing is committed with it any more
	fenced atomic.Bool // the broker refused a commit: the group has moved on
}

// claim is this member's ownership of one partition in one generation.
type claim struct {
	tp     topicPartition
	gen    *generation
	start  int64              // the first offset read (or kafka.FirstOffset, kafka.LastOffset)
	ctx    context.Context    // ends when the claim is revoked (its generation ended)
	cancel context.CancelFunc // revokes the claim
	// next is the partition's committed offset (the next offset to read) as
	// this member knows it, -1 when there is none; under Source.mu.
	next int64
	// hwm is the partition's high watermark (the offset after its last
	// message) as the newest fetched message carried it, 0 before the first;
	// under Source.mu. Lag (Source.Collector) is hwm - next.
	hwm int64
}

// fetched is a message (or an error) read for a claim, or an error of the
// group (c nil).
type fetched struct {
	m   kafka.Message
	c   *claim
	err error
}

// ack is the Ack of a delivery returned by Fetch.
type ack struct {
	m kafka.Message
	c *claim
}

// MessageOf returns the kafka.Message a delivery was built from, by
// Source.Fetch or by ToDelivery; false for any other delivery.
func MessageOf(d consumer.Delivery) (kafka.Message, bool) {
	switch a := d.Ack.(type) {
	case *ack:
		return a.m, true
	case kafka.Message:
		return a, true
	}
	return kafka.Message{}, false
}

// groupConfig is the consumer-group half of rc, mapped as kafka-go's own
// consumer-group Reader maps it.
func groupConfig(rc kafka.ReaderConfig) kafka.ConsumerGroupConfig {
	return kafka.ConsumerGroupConfig{
		ID: rc.GroupID, Brokers: rc.Brokers, Dialer: rc.Dialer, Topics: topics(rc),
		GroupBalancers: rc.GroupBalancers, HeartbeatInterval: rc.HeartbeatInterval,
		PartitionWatchInterval: rc.PartitionWatchInterval, WatchPartitionChanges: rc.WatchPartitionChanges,
		SessionTimeout: rc.SessionTimeout, RebalanceTimeout: rc.RebalanceTimeout, JoinGroupBackoff: rc.JoinGroupBackoff,
		RetentionTime: rc.RetentionTime, StartOffset: rc.StartOffset, Logger: rc.Logger, ErrorLogger: rc.ErrorLogger,
	}
}

// partitionConfig is the fetch half of rc, for a Reader of one partition
// (no group: it never commits).
func partitionConfig(rc kafka.ReaderConfig, tp topicPartition) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers: rc.Brokers, Topic: tp.topic, Partition: tp.partition, Dialer: rc.Dialer,
		QueueCapacity: rc.QueueCapacity, MinBytes: rc.MinBytes, MaxBytes: rc.MaxBytes, MaxWait: rc.MaxWait,
		ReadBatchTimeout: rc.ReadBatchTimeout, ReadLagInterval: -1, ReadBackoffMin: rc.ReadBackoffMin,
		ReadBackoffMax: rc.ReadBackoffMax, Logger: rc.Logger, ErrorLogger: rc.ErrorLogger,
		IsolationLevel: rc.IsolationLevel, MaxAttempts: rc.MaxAttempts, OffsetOutOfRangeError: rc.OffsetOutOfRangeError,
	}
}

// countsWait bounds one read of the consumed topics' partition counts.
const countsWait = 10 * time.Second

// start joins the group, once, after reading the topics' partition counts
// (the first generation's watch compares with them; the read ends with
// ctx, Close or countsWait). It returns io.EOF after Close.
func (s *Source) start(ctx context.Context) error {
	s.mu.Lock()
	first := !s.closed && !s.started
	s.mu.Unlock()
	var base map[string]int
	if first && s.watch {
		rctx, cancel := context.WithTimeout(ctx, countsWait)
		stop := context.AfterFunc(s.ctx, cancel)
		base, _ = s.counts(rctx) // on error the first generation reads its own
		stop()
		cancel()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return io.EOF
	}
	if s.started {
		return nil
	}
	cg, err := kafka.NewConsumerGroup(s.cgc)
	if err != nil {
		return fmt.Errorf("idemq/kafkaadapter: consumer group: %w", err)
	}
	s.started, s.cg, s.base = true, cg, base
	s.wg.Add(1)
	go s.runGroup(cg)
	return nil
}

// receive returns the next message or error read, io.EOF once the Source
// is closed.
func (s *Source) receive(ctx context.Context) (kafka.Message, *claim, error) {
	select {
	case <-ctx.Done():
		return kafka.Message{}, nil, ctx.Err()
	case <-s.ctx.Done():
		return kafka.Message{}, nil, io.EOF
	case f := <-s.msgs:
		return f.m, f.c, f.err
	}
}

// deliver turns m, read for c, into a delivery, unless c was revoked or m
// was completed already (an earlier claim of this member handled it).
func (s *Source) deliver(m kafka.Message, c *claim) (consumer.Delivery, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c != nil && c.ctx.Err() != nil {
		s.stats.DroppedDeliveries++
		return consumer.Delivery{}, false
	}
	if c != nil && m.HighWaterMark > c.hwm {
		c.hwm = m.HighWaterMark
	}
	if done, ok := s.completed[topicPartition{m.Topic, m.Partition}]; ok && m.Offset <= done {
		return consumer.Delivery{}, false
	}
	d := ToDelivery(m, s.hdr)
	d.Ack = &ack{m: m, c: c}
	return d, true
}

// runGroup hands each generation of the group to serve, and the group's
// errors to Fetch, until the group is closed.
func (s *Source) runGroup(cg *kafka.ConsumerGroup) {
	defer s.wg.Done()
	for {
		gen, err := cg.Next(s.ctx)
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				return
			}
			select {
			case s.msgs <- fetched{err: groupError(err)}:
			case <-s.ctx.Done():
				return
			}
			continue
		}
		// kafka-go waits for functions started with the generation before it
		// rejoins the group: serve returns once the generation is given up.
		// (Counted in s.wg too: kafka-go does not wait for a function started
		// after the generation ended.)
		s.wg.Add(1)
		gen.Start(func(ctx context.Context) {
			defer s.wg.Done()
			s.serve(ctx, gen.ID, gen, gen.Assignments)
		})
	}
}

// groupError is an error of ConsumerGroup.Next as Fetch sees it. io.EOF
// there means a coordinator connection was closed, not the Source: it
// becomes io.ErrUnexpectedEOF, which Fetch retries.
func groupError(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("idemq/kafkaadapter: consumer group: %w: %v", io.ErrUnexpectedEOF, err)
	}
	return fmt.Errorf("idemq/kafkaadapter: consumer group: %w", err)
}

// serve claims a generation's partitions, reads them until the generation
// ends (gctx) or the Source closes, then gives them up (revoke).
func (s *Source) serve(gctx context.Context, id int32, commit offsetCommitter, assignments map[string][]kafka.PartitionAssignment) {
	g := &generation{id: id, commit: commit}
	claims := s.claim(g, assignments)
	for _, c := range claims {
		if c.start >= 0 && c.start > c.next {
			// This member completed offsets the group has not committed (its
			// commits were dropped when it lost the partition): commit them now.
			if err := s.commitGen(g, map[topicPartition]int64{c.tp: c.start}); err != nil {
				s.log.Warn("idemq: kafka commit of completed offsets failed; the next commit covers them", "err", err,
					"topic", c.tp.topic, "partition", c.tp.partition, "offset", c.start)
			}
		}
		s.wg.Add(1)
		go s.readPartition(c)
	}
	s.log.Info("idemq: kafka generation joined", "group", s.cgc.ID, "generation", id, "partitions", len(claims))
	changed := make(chan struct{})
	wctx, stopWatch := context.WithCancel(s.ctx)
	watched := make(chan struct{})
	if s.watch {
		s.mu.Lock()
		base := s.base
		s.base = nil
		s.mu.Unlock()
		go func() {
			defer close(watched)
			s.watchPartitions(wctx, base, changed)
		}()
	} else {
		close(watched)
	}
	select {
	case <-gctx.Done():
	case <-s.ctx.Done():
	case <-changed: // returning ends the generation: kafka-go rejoins
	}
	stopWatch()
	<-watched
	s.revoke(g, claims)
	if s.watch && s.ctx.Err() == nil {
		// The next generation's baseline, read before kafka-go rejoins: a
		// partition added after it is seen by the next generation's watch
		// even when the new assignment was made without it.
		ctx, cancel := context.WithTimeout(s.ctx, min(s.flushWait, countsWait))
		base, err := s.counts(ctx)
		cancel()
		if err == nil {
			s.mu.Lock()
			s.base = base
			s.mu.Unlock()
		}
	}
}

// watchPartitions reads the consumed topics' partition counts every
// watchEvery and closes changed when they differ from base (nil: the
// counts read first), or returns when ctx ends. A failed read is logged
// and tried again at the next tick.
func (s *Source) watchPartitions(ctx context.Context, base map[string]int, changed chan<- struct{}) {
	read := func() (map[string]int, bool) {
		rctx, cancel := context.WithTimeout(ctx, countsWait)
		defer cancel()
		now, err := s.counts(rctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("idemq: kafka partition watch: reading the topics' partitions failed; trying again", "group", s.cgc.ID,
					"err", err, "retry_in", s.watchEvery)
			}
			return nil, false
		}
		return now, true
	}
	if base == nil {
		base, _ = read()
	}
	t := time.NewTicker(s.watchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, ok := read()
		switch {
		case !ok:
		case base == nil:
			base = now
		case !maps.Equal(now, base):
			s.log.Info("idemq: kafka topic partitions changed; rejoining the group", "group", s.cgc.ID, "was", base, "now", now)
			close(changed)
			return
		}
	}
}

// readPartitionCounts returns the partition count of each consumed topic,
// 0 for a topic that does not exist, from a metadata request to the first
// broker of Reader.Brokers that answers, through Reader.Dialer (its TLS
// and SASL settings).
func (s *Source) readPartitionCounts(ctx context.Context) (map[string]int, error) {
	d := s.rc.Dialer
	if d == nil {
		d = kafka.DefaultDialer
	}
	var conn *kafka.Conn
	var err error
	for _, b := range s.rc.Brokers {
		if conn, err = d.DialContext(ctx, "tcp", b); err == nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	out := map[string]int{}
	for _, t := range topics(s.rc) {
		ps, err := conn.ReadPartitions(t)
		switch {
		case errors.Is(err, kafka.UnknownTopicOrPartition):
			out[t] = 0
		case err != nil:
			return nil, err
		default:
			out[t] = len(ps)
		}
	}
	return out, nil
}

// claim records that this member owns the assigned partitions in g. A
// claim reads from the group's committed offset, or past the offsets this
// member completed already when those are further on.
func (s *Source) claim(g *generation, assignments map[string][]kafka.PartitionAssignment) []*claim {
	s.mu.Lock()
	defer s.mu.Unlock()
	var claims []*claim
	for topic, parts := range assignments {
		for _, pa := range parts {
			tp := topicPartition{topic, pa.ID}
			c := &claim{tp: tp, gen: g, start: pa.Offset, next: -1}
			if pa.Offset >= 0 {
				c.next = pa.Offset
			}
			if done, ok := s.completed[tp]; ok && done+1 > c.next {
				c.start = done + 1
			}
			c.ctx, c.cancel = context.WithCancel(s.ctx)
			s.owned[tp] = c
			claims = append(claims, c)
		}
	}
	s.genID = g.id
	s.stats.Generations++
	s.rebalances++
	return claims
}

// revoke gives up g's claims: Run drops their waiting deliveries and stops
// retrying them (the claims' contexts end), then commits what it completed
// while g may still commit (the flush registered with OnRevoke, bounded by
// flushWait), then g is closed: nothing more is committed with it.
func (s *Source) revoke(g *generation, claims []*claim) {
	for _, c := range claims {
		c.cancel()
	}
	s.mu.Lock()
	flush, closing := s.flush, s.closed
	s.mu.Unlock()
	if flush != nil && !closing && !g.fenced.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), s.flushWait)
		flush(ctx)
		cancel()
	}
	g.mu.Lock()
	g.closed = true
	s.mu.Lock()
	for _, c := range claims {
		if s.owned[c.tp] == c {
			delete(s.owned, c.tp)
		}
	}
	if s.genID == g.id {
		s.genID = -1
	}
	s.mu.Unlock()
	g.mu.Unlock()
	s.log.Info("idemq: kafka generation ended; its partitions are given up", "group", s.cgc.ID, "generation", g.id, "partitions", len(claims))
}

// partitionReader is what readPartition uses of a *kafka.Reader (a fake in
// tests: Source.newReader).
type partitionReader interface {
	SetOffset(offset int64) error
	FetchMessage(ctx context.Context) (kafka.Message, error)
	Stats() kafka.ReaderStats
	Close() error
}

// newKafkaReader is Source.newReader outside tests.
func newKafkaReader(rc kafka.ReaderConfig) partitionReader { return kafka.NewReader(rc) }

// readPartition reads c's partition into s.msgs until c is revoked.
//
// A retriable error (fetchRetriable) stays here, so it holds up no other
// partition: it is logged with the partition, and the reader backs off,
// 100ms doubling up to FetchRetryMax, before it reports another error.
// kafka-go's reader retries on its own meanwhile (ReadBackoffMin to
// ReadBackoffMax) and queues an error per failed attempt, so the reader
// keeps taking what it queues while it backs off: a message ends the
// backoff at once, and errors read during it are counted in the next
// warning (or in the info line when the partition reads again) instead of
// each waiting a longer backoff. A message resets the backoff to 100ms.
// Other errors go to Fetch.
func (s *Source) readPartition(c *claim) {
	defer s.wg.Done()
	r := s.newReader(partitionConfig(s.rc, c.tp))
	s.mu.Lock()
	s.readers[c] = r
	s.mu.Unlock()
	defer func() {
		_ = r.Close()
		s.mu.Lock()
		delete(s.readers, c)
		addReaderStats(&s.retired, r.Stats(), false)
		s.mu.Unlock()
	}()
	if err := r.SetOffset(c.start); err != nil {
		return
	}
	b := s.fetchBackoff()
	var (
		until   time.Time // the end of the backoff in progress, zero when none
		failing time.Time // the first error since the last message, zero when none
		errs    int       // errors since the last message
		unsaid  int       // errors read during backoffs, not logged yet
	)
	for {
		ctx, cancel := c.ctx, context.CancelFunc(func() {})
		if !until.IsZero() {
			ctx, cancel = context.WithDeadline(c.ctx, until)
		}
		m, err := r.FetchMessage(ctx)
		waited := !until.IsZero() && errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil
		cancel()
		if c.ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			if errs > 0 {
				s.log.Info("idemq: kafka fetch recovered", "topic", c.tp.topic, "partition", c.tp.partition,
					"errors", errs, "failing_for", time.Since(failing))
			}
			b.Reset()
			until, failing, errs, unsaid = time.Time{}, time.Time{}, 0, 0
		case waited: // the backoff is over; the next error is reported
			until = time.Time{}
			continue
		case fetchRetriable(err):
			if errs == 0 {
				failing = time.Now()
			}
			errs++
			if !until.IsZero() {
				unsaid++
				continue
			}
			wait := b.NextBackOff()
			s.log.Warn("idemq: kafka fetch failed; fetching again", "topic", c.tp.topic, "partition", c.tp.partition,
				"err", err, "retry_in", wait, "errors_unlogged", unsaid)
			until, unsaid = time.Now().Add(wait), 0
			continue
		}
		select {
		case s.msgs <- fetched{m: m, c: c, err: err}:
		case <-c.ctx.Done():
			return
		}
	}
}

// Commit implements consumer.Source. For each delivery it commits offset+1
// of its partition, with the generation in which this member owns the
// partition now, and only above the offset committed for it already: the
// committed offset of a partition never decreases. It drops, without
// error, a delivery of a partition this member does not own (its
// generation ended: the partition's next owner reads on from its last
// commit), and a commit the broker refuses because the group has moved on
// (illegal generation, unknown member, rebalance in progress); Stats counts
// them. A delivery completed under an earlier generation of this member is
// committed with the current one when this member owns its partition
// again: everything up to it is done. Other commit errors are returned
// (Run tries again at its next flush); a delivery that this adapter did not
// build is an error.
func (s *Source) Commit(ctx context.Context, done []consumer.Delivery) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	plan := map[*generation]map[topicPartition]int64{}
	s.mu.Lock()
	for _, d := range done {
		m, ok := MessageOf(d)
		if !ok {
			s.mu.Unlock()
			return fmt.Errorf("idemq/kafkaadapter: delivery %s was not fetched by this adapter", d.Position)
		}
		tp := topicPartition{m.Topic, m.Partition}
		if last, ok := s.completed[tp]; !ok || m.Offset > last {
			s.completed[tp] = m.Offset
		}
		c := s.owned[tp]
		if c == nil {
			s.stats.DroppedCommits++
			continue
		}
		if m.Offset+1 <= c.next {
			continue // committed already
		}
		if plan[c.gen] == nil {
			plan[c.gen] = map[topicPartition]int64{}
		}
		plan[c.gen][tp] = max(plan[c.gen][tp], m.Offset+1)
	}
	s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	var errs []error
	for g, offs := range plan {
		if err := s.commitGen(g, offs); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// commitGen commits offs with g unless g was given up or fenced.
func (s *Source) commitGen(g *generation, offs map[topicPartition]int64) error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed || g.fenced.Load() {
		s.mu.Lock()
		s.stats.DroppedCommits += int64(len(offs))
		s.mu.Unlock()
		return nil
	}
	req := map[string]map[int]int64{}
	for tp, off := range offs {
		if req[tp.topic] == nil {
			req[tp.topic] = map[int]int64{}
		}
		req[tp.topic][tp.partition] = off
	}
	err := g.commit.CommitOffsets(req)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil:
		s.stats.Commits++
		for tp, off := range offs {
			if c := s.owned[tp]; c != nil && c.gen == g && off > c.next {
				c.next = off
			}
		}
		return nil
	case generationEnded(err):
		g.fenced.Store(true)
		s.stats.DroppedCommits += int64(len(offs))
		s.log.Info("idemq: kafka commit refused: the group has moved on; the partitions' next owners read on from their last commit",
			"group", s.cgc.ID, "generation", g.id, "partitions", len(offs), "err", err)
		return nil
	default:
		return fmt.Errorf("idemq/kafkaadapter: commit with generation %d: %w", g.id, err)
	}
}

// generationEnded reports whether a commit error means the generation can
// no longer commit.
func generationEnded(err error) bool {
	return errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.UnknownMemberId) ||
		errors.Is(err, kafka.RebalanceInProgress) || errors.Is(err, kafka.FencedInstanceID)
}

// LaneContext implements consumer.Revocable: the context of the claim d was
// read for, which ends when that claim's generation ends; nil for a
// delivery that Fetch did not return.
func (s *Source) LaneContext(d consumer.Delivery) context.Context {
	if a, ok := d.Ack.(*ack); ok && a.c != nil {
		return a.c.ctx
	}
	return nil
}

// OnRevoke implements consumer.Revocable: when a generation ends, the
// Source calls flush before it gives the generation's partitions up, so
// that what Run completed is committed with that generation. The flush is
// bounded by a third of Reader.SessionTimeout or Reader.RebalanceTimeout,
// whichever is shorter (kafka-go's defaults: 30s each), so that the member
// rejoins the group in time.
func (s *Source) OnRevoke(flush func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flush = flush
}

// Close implements consumer.Source: it leaves the group (ending the
// generation in hand, whose partitions are given up without a further
// flush: Run has flushed before it closes the source) and stops the
// partition readers. Fetch returns io.EOF afterwards; Commit drops
// everything.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	cg := s.cg
	s.mu.Unlock()
	var err error
	if cg != nil {
		err = cg.Close() // ends the generation: serve gives it up
	}
	s.cancel()
	s.wg.Wait()
	if t, ok := s.admin.(*kafka.Transport); ok {
		t.CloseIdleConnections() // the horizon check's connections
	}
	return err
}

// Stats is a snapshot of a Source's activity (Source.Stats).
type Stats struct {
	// Generation is the ID of the consumer-group generation in hand, -1
	// between generations.
	Generation int32
	// Assigned lists, by topic, the partitions this member owns in that
	// generation, in increasing order.
	Assigned map[string][]int
	// Generations counts the generations this member has joined.
	Generations int64
	// Commits counts successful offset-commit requests.
	Commits int64
	// DroppedCommits counts partition offsets not committed because this
	// member no longer owned the partition: its generation had ended (given
	// up, or refused by the broker). The partition's next owner reads on
	// from the last commit.
	DroppedCommits int64
	// DroppedDeliveries counts messages read for a partition whose
	// generation ended before Fetch returned them.
	DroppedDeliveries int64
	// Reader sums the kafka-go statistics of the partition readers: counters
	// and summaries since the previous Stats call (as kafka.Reader.Stats),
	// gauges (Lag, QueueLength, QueueCapacity) of the live readers now.
	// Rebalances counts the generations joined since the previous call;
	// Offset and Partition are -1.
	Reader kafka.ReaderStats
}

// Stats returns a snapshot of the Source's activity. The counters are
// cumulative, except Reader's (since the previous call).
func (s *Source) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.stats
	out.Generation = s.genID
	out.Assigned = map[string][]int{}
	for tp, c := range s.owned {
		if c.gen.id == s.genID {
			out.Assigned[tp.topic] = append(out.Assigned[tp.topic], tp.partition)
		}
	}
	for _, ps := range out.Assigned {
		slices.Sort(ps)
	}
	rs := s.retired
	s.retired = kafka.ReaderStats{}
	for _, r := range s.readers {
		addReaderStats(&rs, r.Stats(), true)
	}
	rs.Rebalances, s.rebalances = s.rebalances, 0
	rs.Offset, rs.Partition, rs.Topic = -1, "-1", s.rc.Topic
	rs.MinBytes, rs.MaxBytes, rs.MaxWait = int64(s.rc.MinBytes), int64(s.rc.MaxBytes), s.rc.MaxWait
	if s.rc.Dialer != nil {
		rs.ClientID = s.rc.Dialer.ClientID
	}
	rs.DeprecatedFetchesWithTypo = rs.Fetches
	out.Reader = rs
	return out
}

// addReaderStats adds st to dst: counters and summaries, and the gauges
// when gauges is set.
func addReaderStats(dst *kafka.ReaderStats, st kafka.ReaderStats, gauges bool) {
	dst.Dials += st.Dials
	dst.Fetches += st.Fetches
	dst.Messages += st.Messages
	dst.Bytes += st.Bytes
	dst.Timeouts += st.Timeouts
	dst.Errors += st.Errors
	addDuration(&dst.DialTime, st.DialTime)
	addDuration(&dst.ReadTime, st.ReadTime)
	addDuration(&dst.WaitTime, st.WaitTime)
	addSummary(&dst.FetchSize, st.FetchSize)
	addSummary(&dst.FetchBytes, st.FetchBytes)
	if gauges {
		dst.Lag += st.Lag
		dst.QueueLength += st.QueueLength
		dst.QueueCapacity += st.QueueCapacity
	}
}

func addDuration(dst *kafka.DurationStats, st kafka.DurationStats) {
	if st.Count == 0 {
		return
	}
	if dst.Count == 0 || st.Min < dst.Min {
		dst.Min = st.Min
	}
	dst.Max = max(dst.Max, st.Max)
	dst.Count += st.Count
	dst.Sum += st.Sum
	dst.Avg = dst.Sum / time.Duration(dst.Count)
}

func addSummary(dst *kafka.SummaryStats, st kafka.SummaryStats) {
	if st.Count == 0 {
		return
	}
	if dst.Count == 0 || st.Min < dst.Min {
		dst.Min = st.Min
	}
	dst.Max = max(dst.Max, st.Max)
	dst.Count += st.Count
	dst.Sum += st.Sum
	dst.Avg = dst.Sum / dst.Count
}
