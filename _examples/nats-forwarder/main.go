// Command nats-forwarder shows the outbox forwarder relaying to NATS
// JetStream: account transfers are written with their events in one
// transaction each, a Forwarder relays the events to a JetStream stream
// (with Nats-Msg-Id = the outbox's stable id, so the server drops copies),
// and a watermill-nats subscriber reads them.
//
//	go run ./_examples/nats-forwarder
//
// No setup: PostgreSQL is a throwaway server, NATS an embedded nats-server
// with JetStream. Halfway through, the NATS server is restarted: the
// forwarder waits and resumes. The last line printed is OK.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
)

const (
	accounts  = 10
	transfers = 300
)

func main() { exampledb.Main(run) }

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	db, err := exampledb.Start(ctx)
	if err != nil {
		return err
	}
	defer db.Stop()
	logger := exampledb.Logger()

	if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, "transfers", 4); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE transfers (id integer PRIMARY KEY, account text NOT NULL, cents bigint NOT NULL)`); err != nil {
		return err
	}

	// NATS with JetStream, its store in a temporary directory.
	store, err := os.MkdirTemp("", "outbox-nats-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(store)
	ns, err := startNATS(-1, store)
	if err != nil {
		return err
	}
	defer func() { ns.Shutdown() }()
	url := ns.ClientURL()
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	js, _ := natsjs.New(nc)
	// The stream that stores the subject; Duplicates is the window in which
	// the server drops a message whose Nats-Msg-Id it already stored.
	if _, err := js.CreateStream(ctx, natsjs.StreamConfig{
		Name: "transfers", Subjects: []string{"transfers"}, Storage: natsjs.FileStorage, Duplicates: 5 * time.Minute,
	}); err != nil {
		return err
	}
	nc.Close()
	fmt.Printf("NATS with JetStream on %s, stream transfers\n", url)

	target, err := jetstream.NewTarget(jetstream.Config{
		URL: url, Options: []nats.Option{nats.ReconnectWait(200 * time.Millisecond)},
	}, logger)
	if err != nil {
		return err
	}
	defer target.Close()
	// A message JetStream refuses for good goes to the dead-letter store;
	// MaxAttempts stays at the forwarder's default (outbox.RetryForever),
	// so that the sends that fail while NATS is down never dead-letter a
	// healthy message.
	deadLetters, err := deadletter.NewStore(deadletter.Config{Pool: db.Pool}, logger)
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Pool: db.Pool, RejectHandler: deadLetters},
		Topics:     []string{"transfers"},
		Target:     target,
	}, logger)
	if err != nil {
		return err
	}
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- fwd.Run(ctx) }()
	defer func() { _ = fwd.Close(); <-fwdDone }()

	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: db.Pool}, logger)
	if err != nil {
		return err
	}
	for id := 1; id <= transfers; id++ {
		if id == transfers/2 {
			// Restart NATS in the middle: sends fail meanwhile, nothing is lost.
			port := ns.Addr().(*net.TCPAddr).Port
			ns.Shutdown()
			ns.WaitForShutdown()
			fmt.Printf("NATS stopped after %d transfers\n", id-1)
			time.Sleep(time.Second)
			if ns, err = startNATS(port, store); err != nil {
				return err
			}
			fmt.Println("NATS started again")
		}
		if err := transfer(ctx, db, pub, id, "account-"+strconv.Itoa(id%accounts), int64(id)); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d transfers of %d accounts\n", transfers, accounts)

	// A Watermill application reading the stream.
	sub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{URL: url, Logger: watermill.NopLogger{}})
	if err != nil {
		return err
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "transfers")
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for len(seen) < transfers {
		var m *message.Message
		select {
		case m = <-msgs:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d events arrived: %w", len(seen), transfers, ctx.Err())
		}
		m.Ack()
		id := m.Metadata.Get(outbox.MetadataID)
		if seen[id] {
			return fmt.Errorf("event %s arrived twice: Nats-Msg-Id should have dropped the copy", id)
		}
		seen[id] = true
		account := m.Metadata.Get(outbox.PublishPartitionKeyMetadata)
		n, _ := strconv.Atoi(m.Metadata.Get("transfer_id"))
		if n <= last[account] {
			return fmt.Errorf("%s: transfer %d arrived after %d", account, n, last[account])
		}
		last[account] = n
	}
	select {
	case m := <-msgs:
		return fmt.Errorf("unexpected extra event %s", m.Metadata.Get(outbox.MetadataID))
	case <-time.After(500 * time.Millisecond):
	}
	st := fwd.Stats()
	fmt.Printf("all %d events read from JetStream once each, in order per account (%d sends failed while NATS was down and were retried)\n", len(seen), st.Failures)
	return nil
}

func startNATS(port int, store string) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: store, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return nil, fmt.Errorf("nats-server not ready")
	}
	return ns, nil
}

// transfer stores a transfer and publishes TransferMade in one transaction.
func transfer(ctx context.Context, db *exampledb.DB, pub *outbox.Publisher, id int, account string, cents int64) error {
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO transfers (id, account, cents) VALUES ($1, $2, $3)`, id, account, cents); err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"transfer_id":%d,"account":%q,"cents":%d}`, id, account, cents)))
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, account)
	msg.Metadata.Set("transfer_id", strconv.Itoa(id))
	msg.SetContext(outbox.WithTx(ctx, tx))
	if err := pub.Publish("transfers", msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
