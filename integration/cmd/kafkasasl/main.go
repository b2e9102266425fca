// Command kafkasasl prepares the SASL_SSL listener of the test Kafka that
// scripts/services.sh starts: over the PLAINTEXT listener (whose
// User:ANONYMOUS is a super user) it creates or updates the SCRAM-SHA-256
// and SCRAM-SHA-512 credentials of the admin user and of the read-only
// user, grants the read-only user Read and Describe on the topics and
// consumer groups whose names start with the test prefix (and nothing
// else: no DescribeConfigs), then logs in over TLS with each user until the
// broker accepts them. It runs after every start; every step is
// idempotent.
//
//	go run ./cmd/kafkasasl -plaintext 127.0.0.1:9092 -sasl 127.0.0.1:9094 -ca ca.pem \
//	  -admin idemq-test:PASSWORD -reader idemq-reader:PASSWORD -prefix idemq-sasl-
package main

import (
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"flag"
	"fmt"
	"hash"
	"log"
	"os"
	"strings"
	"time"

	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/segmentio/kafka-go"
)

func main() {
	plaintext := flag.String("plaintext", "127.0.0.1:9092", "PLAINTEXT listener (super user User:ANONYMOUS)")
	saslAddr := flag.String("sasl", "127.0.0.1:9094", "SASL_SSL listener to check the logins on")
	ca := flag.String("ca", "", "PEM CA that signed the SASL_SSL listener's certificate")
	admin := flag.String("admin", "", "admin user NAME:PASSWORD (a super user in server.properties)")
	reader := flag.String("reader", "", "read-only user NAME:PASSWORD")
	prefix := flag.String("prefix", "idemq-sasl-", "topics and consumer groups the read-only user may read")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("kafkasasl: ")
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, *plaintext, *saslAddr, *ca, *admin, *reader, *prefix); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

type user struct{ name, password string }

func parseUser(flagName, v string) (user, error) {
	name, pw, ok := strings.Cut(v, ":")
	if !ok || name == "" || pw == "" {
		return user{}, fmt.Errorf("-%s wants NAME:PASSWORD", flagName)
	}
	return user{name, pw}, nil
}

func run(ctx context.Context, plaintext, saslAddr, ca, adminFlag, readerFlag, prefix string) error {
	admin, err := parseUser("admin", adminFlag)
	if err != nil {
		return err
	}
	reader, err := parseUser("reader", readerFlag)
	if err != nil {
		return err
	}
	cl := &kafka.Client{Addr: kafka.TCP(plaintext), Timeout: 10 * time.Second}
	// Right after a start the controller may not take writes yet: retry.
	if err := retry(ctx, "create SCRAM credentials", func() error { return upsertUsers(ctx, cl, admin, reader) }); err != nil {
		return err
	}
	if err := retry(ctx, "create ACLs", func() error { return createACLs(ctx, cl, "User:"+reader.name, prefix) }); err != nil {
		return err
	}
	for _, u := range []user{admin, reader} {
		sec := kafkasec.Config{TLS: kafkasec.TLS{CAFile: ca}, SASL: kafkasec.SASL{Mechanism: kafkasec.ScramSHA512, Username: u.name, Password: u.password}}
		rt, err := sec.Transport()
		if err != nil {
			return err
		}
		scl := &kafka.Client{Addr: kafka.TCP(saslAddr), Timeout: 10 * time.Second, Transport: rt}
		if err := retry(ctx, "log in as "+u.name+" on "+saslAddr, func() error {
			_, err := scl.Metadata(ctx, &kafka.MetadataRequest{})
			return kafkasec.Explain(err)
		}); err != nil {
			return err
		}
	}
	log.Printf("users %s (admin) and %s (read-only on %s*) log in on %s", admin.name, reader.name, prefix, saslAddr)
	return nil
}

func retry(ctx context.Context, what string, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// upsertUsers sets both SCRAM credentials of each user, one request per
// credential (Kafka refuses a request that alters a user twice).
func upsertUsers(ctx context.Context, cl *kafka.Client, users ...user) error {
	for _, u := range users {
		for _, m := range []struct {
			mech kafka.ScramMechanism
			h    func() hash.Hash
			size int
		}{{kafka.ScramMechanismSha256, sha256.New, sha256.Size}, {kafka.ScramMechanismSha512, sha512.New, sha512.Size}} {
			salt := make([]byte, 32)
			_, _ = rand.Read(salt)
			const iterations = 4096 // Kafka's minimum
			salted, err := pbkdf2.Key(m.h, u.password, salt, iterations, m.size)
			if err != nil {
				return err
			}
			resp, err := cl.AlterUserScramCredentials(ctx, &kafka.AlterUserScramCredentialsRequest{Upsertions: []kafka.UserScramCredentialsUpsertion{{
				Name: u.name, Mechanism: m.mech, Iterations: iterations, Salt: salt, SaltedPassword: salted}}})
			if err != nil {
				return err
			}
			for _, r := range resp.Results {
				if r.Error != nil {
					return fmt.Errorf("user %s: %w", r.User, r.Error)
				}
			}
		}
	}
	return nil
}

func createACLs(ctx context.Context, cl *kafka.Client, principal, prefix string) error {
	var acls []kafka.ACLEntry
	for _, rt := range []kafka.ResourceType{kafka.ResourceTypeTopic, kafka.ResourceTypeGroup} {
		for _, op := range []kafka.ACLOperationType{kafka.ACLOperationTypeRead, kafka.ACLOperationTypeDescribe} {
			acls = append(acls, kafka.ACLEntry{ResourceType: rt, ResourceName: prefix, ResourcePatternType: kafka.PatternTypePrefixed,
				Principal: principal, Host: "*", Operation: op, PermissionType: kafka.ACLPermissionTypeAllow})
		}
	}
	resp, err := cl.CreateACLs(ctx, &kafka.CreateACLsRequest{ACLs: acls})
	if err != nil {
		return err
	}
	return errors.Join(resp.Errors...)
}
