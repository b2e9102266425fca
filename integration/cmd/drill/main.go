// Command drill runs idemq's exactly-once checks across the faults of a
// real topology: `make drill-<name>` starts the topology (scripts/topology),
// runs its faults while messages flow, counts from durable state (business
// rows, consumption records, dead letters, topic contents, committed
// offsets), prints a summary table and stops everything it started. It
// exits 1 when exactly-once did not hold where the topology promises it.
//
//	drill pg-failover [flags]      a Postgres primary and a streaming standby: promotion under load
//	drill kafka-cluster [flags]    three KRaft brokers: leaders killed, partitions added, offsets reset
//	drill redis-failover [flags]   a Redis master, a replica and 3 Sentinels: the master killed under load
//	drill partition [flags]        latency, cuts, black holes and slow closes between idemq and Postgres
//	drill clock-skew [flags]       two processes whose clocks are 5 minutes apart share leases and keys
//
// Each subcommand's -h lists its flags. The brokers and Redis come from
// scripts/services.sh (TEST_KAFKA_BROKERS, ...), as for the integration tests.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

var drills = []struct {
	name, what string
	run        func(ctx context.Context, args []string) error
}{
	{"pg-failover", "a Postgres primary and a streaming standby (sync and async): the primary killed and the standby promoted while messages flow", runPGFailover},
	{"kafka-cluster", "three KRaft brokers, RF 3, min.insync.replicas 2: partition leaders SIGKILLed and restarted, partitions added and offsets reset with Kafka's tools, while a group of two consumes and the relay publishes", runKafkaCluster},
	{"redis-failover", "a Redis master, a replica and 3 Sentinels: the master killed while the fast path, the Redis-only store and submit tokens work", runRedisFailover},
	{"clock-skew", "two workers whose wall clocks are minutes apart share lease records, consumption records and HTTP keys", runClockSkew},
	{"partition", "the consumer, the relay and the HTTP middleware reach Postgres through toxiproxy: latency, a cut, a black hole, a slow close", runPartition},
	{"clock-skew-worker", "(started by clock-skew)", runSkewWorker},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	for _, d := range drills {
		if d.name == os.Args[1] {
			if err := d.run(ctx, os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "drill %s: %v\n", d.name, err)
				os.Exit(1)
			}
			return
		}
	}
	usage()
	os.Exit(2)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: drill NAME [flags]   (NAME -h lists its flags)")
	for _, d := range drills {
		fmt.Fprintf(os.Stderr, "  %-14s %s\n", d.name, d.what)
	}
}
