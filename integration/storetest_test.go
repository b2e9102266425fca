package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/storetest"
)

// The store conformance suite (dedup/storetest) on the real services: the
// Postgres store in its three modes and the Redis-only store. Each case gets
// a fresh schema or key prefix. The in-memory store runs it in its own
// package (dedup/memstore), without services.

// storeMaxAttempts is the MaxAttempts of the stores under the suite (it
// takes 3 to 10; fewer attempts, fewer copies to send).
const storeMaxAttempts = 3

// pgHarness is a fresh Postgres store in mode.
func pgHarness(t *testing.T, mode func(*pgstore.Store) storetest.Mode) storetest.Harness {
	return pgHarnessFor(setup(t, func(c *pgstore.Config) { c.MaxAttempts = storeMaxAttempts }), mode)
}

// pgHarnessFor is the harness of the store of e in mode.
func pgHarnessFor(e *env, mode func(*pgstore.Store) storetest.Mode) storetest.Harness {
	records := e.table("consumption_records")
	update := func(set string) func(ctx context.Context, scope, messageID string) error {
		return func(ctx context.Context, scope, messageID string) error {
			tag, err := e.pool.Exec(ctx, `update `+records+` set `+set+` where scope = $1 and message_id = $2`, scope, messageID)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("no record %s/%s", scope, messageID)
			}
			return err
		}
	}
	return storetest.Harness{
		Store: e.store, Mode: mode(e.store), Admin: e.store,
		ExpireLease:  update(`lease_until = now() - interval '1 millisecond'`),
		ExpireRecord: update(`expires_at = now() - interval '1 millisecond'`),
		Purge: func(ctx context.Context) error {
			_, err := e.store.Purge(ctx, 100)
			return err
		},
	}
}

// pgFeatures: the Postgres store can do everything the suite asks.
var pgFeatures = storetest.Features{}

func TestStoreConformancePostgresAtomic(t *testing.T) {
	t.Parallel()
	storetest.Run(t, pgFeatures, func(t *testing.T) storetest.Harness {
		return pgHarness(t, func(s *pgstore.Store) storetest.Mode { return storetest.Atomic(s) })
	})
}

func TestStoreConformancePostgresBatched(t *testing.T) {
	t.Parallel()
	storetest.Run(t, pgFeatures, func(t *testing.T) storetest.Harness {
		return pgHarness(t, func(s *pgstore.Store) storetest.Mode { return storetest.Batched(s) })
	})
}

func TestStoreConformancePostgresLease(t *testing.T) {
	t.Parallel()
	storetest.Run(t, pgFeatures, func(t *testing.T) storetest.Harness {
		return pgHarness(t, func(s *pgstore.Store) storetest.Mode { return storetest.Leased(s, dedup.LeaseOptions{}) })
	})
}

// The Redis-only store: lease mode only, no start markers (it bounds crash
// loops by the lease), and records that expire by their key TTL (no Purge:
// ExpireRecord shortens the record key's TTL).
func TestStoreConformanceRedis(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Features{}, func(t *testing.T) storetest.Harness {
		s := newRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = storeMaxAttempts })
		c := redisClient(t)
		// The keys of one record are "<prefix>:{<scope tag>}:<kind>:<message ID>".
		return storetest.Harness{
			Store: s, Mode: storetest.Leased(s, dedup.LeaseOptions{}), Admin: s,
			ExpireLease: func(ctx context.Context, scope, messageID string) error {
				if _, err := s.Lookup(ctx, scope, messageID); err != nil {
					return err
				}
				// The lease is a key with a TTL: none left is a lease
				// already expired.
				keys, err := c.Keys(ctx, s.Config().Prefix+":*:lease:"+messageID).Result()
				if err != nil || len(keys) == 0 {
					return err
				}
				return c.Del(ctx, keys...).Err()
			},
			ExpireRecord: func(ctx context.Context, _, messageID string) error {
				keys, err := c.Keys(ctx, s.Config().Prefix+":*:rec:"+messageID).Result()
				if err == nil && len(keys) != 1 {
					err = fmt.Errorf("%d record keys of %s", len(keys), messageID)
				}
				if err != nil {
					return err
				}
				return c.PExpire(ctx, keys[0], time.Millisecond).Err()
			},
		}
	})
}
