// Package storetest is the conformance suite of consumption-record stores:
// what every implementation of dedup.Store (and dedup.TxStore) must do, as
// tests a store's own test calls. The Postgres store (atomic, batched and
// lease modes), the Redis-only store and the in-memory store run it.
//
// # Use
//
// A store's test calls Run once per mode it supports, with a function that
// builds a fresh store for each case:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Features{NoStartMarkers: true}, func(t *testing.T) storetest.Harness {
//			st := newEmptyStore(t) // a schema, key prefix or instance of its own
//			return storetest.Harness{
//				Store: st, Mode: storetest.Leased(st, dedup.LeaseOptions{}), Admin: st,
//				ExpireLease: st.expireLeaseForTest, ExpireRecord: st.expireRecordForTest, Purge: st.purge,
//			}
//		})
//	}
//
// The Harness gives the suite what it needs beyond dedup.Store: the
// operator's reads and re-drive (Admin), and two ways to move time on
// without sleeping: ExpireLease ends a live lease now (takeover, fencing and
// crash-loop cases), ExpireRecord ends a record's retention now (the purge
// case). Every case waits on conditions, never on a fixed sleep.
//
// # Features and skips
//
// Features marks what a store cannot do (no start markers, no purge, no
// re-drive). The cases that need it, and the cases of another mode (the lease
// cases in an atomic-mode run, the batch case outside batched mode), are not
// registered at all: Run logs them once, naming the feature or the mode, so
// a CI run shows no skipped test and still says what was left out.
//
// # Stability
//
// Experimental: cases are added as the store contract grows, and a store
// outside this module may start failing a new case in a minor release. The
// Harness fields follow the same rule.
package storetest
