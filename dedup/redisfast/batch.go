package redisfast

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/redis/go-redis/v9"
)

var _ dedup.BatchFastPath = (*FastPath)(nil)

// LookupBatch implements dedup.BatchFastPath: one pipeline holding one MGET
// per scope of ids (a batch has one scope, usually, so one MGET; the keys of
// a scope share a hash slot, so each MGET also works on a Redis Cluster),
// bounded by Config.Timeout and counted as one call by the circuit breaker.
// Each id's answer is as Lookup's: its message ID's entry, else its
// business key's. While the breaker is open it returns ErrBreakerOpen at
// once; on any error the result is nil.
func (f *FastPath) LookupBatch(ctx context.Context, ids []dedup.Identity) ([]dedup.FastPathLookup, error) {
	out := make([]dedup.FastPathLookup, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	// Per scope, in order of first appearance: the keys, and for each key
	// the id it answers and whether it is a business key.
	type slot struct {
		id int
		bk bool
	}
	type group struct {
		keys  []string
		slots []slot
		cmd   *redis.SliceCmd
	}
	var groups []*group
	byScope := make(map[string]*group, 1)
	for i, id := range ids {
		g := byScope[id.Scope]
		if g == nil {
			g = &group{keys: make([]string, 0, 2*len(ids)), slots: make([]slot, 0, 2*len(ids))}
			byScope[id.Scope] = g
			groups = append(groups, g)
		}
		g.keys = append(g.keys, f.Key(id.Scope, "m", id.MessageID))
		g.slots = append(g.slots, slot{id: i})
		if id.BusinessKey != "" {
			g.keys = append(g.keys, f.Key(id.Scope, "b", id.BusinessKey))
			g.slots = append(g.slots, slot{id: i, bk: true})
		}
	}
	err := f.br.call(ctx, f.timeout, func(ctx context.Context) error {
		_, err := f.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, g := range groups {
				g.cmd = p.MGet(ctx, g.keys...)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, g := range groups {
		vals := g.cmd.Val()
		for k, v := range vals {
			sl := g.slots[k]
			if out[sl.id].OK {
				continue // the message ID's entry wins over the business key's
			}
			s, ok := v.(string)
			if !ok {
				continue
			}
			if e, ok := decode(s); ok {
				e.MatchedBy = dedup.ByMessageID
				if sl.bk {
					e.MatchedBy = dedup.ByBusinessKey
				}
				out[sl.id] = dedup.FastPathLookup{Entry: e, OK: true}
			}
		}
	}
	return out, nil
}

// RememberBatch implements dedup.BatchFastPath: every identity's keys are
// set with the TTL in one pipeline, bounded by Config.Timeout and counted as
// one call by the circuit breaker. While the breaker is open it returns
// ErrBreakerOpen at once.
func (f *FastPath) RememberBatch(ctx context.Context, ids []dedup.Identity, entries []dedup.FastPathEntry) error {
	if len(ids) != len(entries) {
		return fmt.Errorf("idemq/redisfast: RememberBatch: %d identities but %d entries", len(ids), len(entries))
	}
	if len(ids) == 0 {
		return nil
	}
	return f.br.call(ctx, f.timeout, func(ctx context.Context) error {
		_, err := f.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				v := encode(entries[i])
				p.Set(ctx, f.Key(id.Scope, "m", id.MessageID), v, f.ttl)
				if id.BusinessKey != "" {
					p.Set(ctx, f.Key(id.Scope, "b", id.BusinessKey), v, f.ttl)
				}
			}
			return nil
		})
		return err
	})
}
