package consumer

import "context"

// Revocable is an optional interface of a Source whose lanes can be taken
// away while Run is running. The Kafka source implements it: a
// consumer-group rebalance can revoke a partition this member is working on,
// and from then on only the partition's next owner may commit it.
//
// Run uses it so that a revoked lane stops at once:
//
//   - a delivery fetched before its lane was revoked and not started yet is
//     dropped: not handled, not committed (the lane's next owner fetches it
//     again from the last committed offset);
//   - a delivery being retried in place is not tried again (the attempt in
//     hand finishes; batched lanes drop the revoked deliveries they retry);
//   - when the source calls the flush function registered with OnRevoke,
//     the deliveries completed so far are passed to Commit at once, not at
//     the next CommitEvery or CommitInterval, so that the source can commit
//     them before it gives the lane up.
//
// A source without this interface is never revoked.
type Revocable interface {
	// LaneContext returns a context that ends when the lane d was fetched
	// for is revoked, or nil when d cannot be revoked. Run calls it before
	// it handles d (and again for each retry of a batch).
	LaneContext(d Delivery) context.Context
	// OnRevoke registers flush; Run registers it before its first Fetch.
	// The source calls flush(ctx) when it is about to give lanes up: flush
	// passes every completed delivery Run holds to Commit, then returns,
	// or returns early when ctx ends or Run has stopped committing.
	OnRevoke(flush func(ctx context.Context))
}

// revocation is the committer's side of Revocable.
type revocation struct {
	rev      Revocable          // nil when the source is not Revocable
	flushReq chan chan struct{} // flushNow's requests to the committer loop
}

func newRevocation(src Source) revocation {
	rev, _ := src.(Revocable)
	return revocation{rev: rev, flushReq: make(chan chan struct{})}
}

// watchRevocations registers flushNow with a Revocable source.
func (c *committer) watchRevocations() {
	if c.rev != nil {
		c.rev.OnRevoke(c.flushNow)
	}
}

// flushNow makes the committer loop flush at once and waits until it has,
// or until ctx ends or the committer stops.
func (c *committer) flushNow(ctx context.Context) {
	reply := make(chan struct{})
	select {
	case c.flushReq <- reply:
	case <-c.quit:
		return
	case <-ctx.Done():
		return
	}
	select {
	case <-reply:
	case <-ctx.Done():
	}
}

// revoked reports whether d's lane was revoked after d was fetched.
func (c *committer) revoked(d Delivery) bool {
	if c.rev == nil {
		return false
	}
	lc := c.rev.LaneContext(d)
	return lc != nil && lc.Err() != nil
}

// hold returns the context under which d is retried in place: ctx, ended
// also when d's lane is revoked; release frees it. revoked reports that d's
// lane was revoked already: d must be dropped.
func (c *committer) hold(ctx context.Context, d Delivery) (dctx context.Context, release func(), revoked bool) {
	if c.rev == nil {
		return ctx, func() {}, false
	}
	lc := c.rev.LaneContext(d)
	if lc == nil {
		return ctx, func() {}, false
	}
	if lc.Err() != nil {
		return nil, nil, true
	}
	dctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(lc, cancel)
	return dctx, func() { stop(); cancel() }, false
}

// live returns ds without the deliveries whose lane was revoked.
func (c *committer) live(ds []Delivery) []Delivery {
	if c.rev == nil {
		return ds
	}
	out := ds[:0]
	for _, d := range ds {
		if !c.revoked(d) {
			out = append(out, d)
		}
	}
	return out
}
