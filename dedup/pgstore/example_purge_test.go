package pgstore_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemq/idemq/dedup/pgstore"
)

// Purge on a schedule inside a service (docs/operations.md copies this; an
// operator may use `idemq purge` from cron instead). Purge deletes expired
// records, reading batches of the given size, and returns how many it
// deleted, also when it fails part way.
func ExampleStore_Purge() {
	ctx := context.Background()
	var store *pgstore.Store // from pgstore.New
	log := slog.Default()

	go func() {
		t := time.NewTicker(10 * time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if n, err := store.Purge(ctx, 5000); err != nil {
					log.Warn("purge failed", "err", err, "deleted", n)
				}
			}
		}
	}()
}
