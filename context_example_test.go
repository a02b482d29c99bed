package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	outbox "github.com/millrace/watermill-outbox"
)

// A handler reads the transaction from the message's context: the one a
// Subscriber of the Transactional strategy opened for the batch, or the one
// the caller stored with WithTx. No type assertion is needed.
func ExampleTxFromContext() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	handler := func(msg *message.Message) error {
		tx, ok := outbox.TxFromContext[pgx.Tx](msg.Context())
		if !ok {
			return errors.New("no pgx transaction: use the Transactional strategy")
		}
		var n int
		if err := tx.QueryRow(msg.Context(), "SELECT length($1::text)", string(msg.Payload)).Scan(&n); err != nil {
			return err
		}
		fmt.Println("read in the transaction:", n)
		return nil
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx)
	msg := message.NewMessage("m-1", []byte("hello"))
	msg.SetContext(outbox.WithTx(ctx, tx))
	fmt.Println(handler(msg))
	fmt.Println(handler(message.NewMessage("m-2", nil)))
	// Output:
	// read in the transaction: 5
	// <nil>
	// no pgx transaction: use the Transactional strategy
}

// With database/sql, TxFromContext[*sql.Tx] returns the *sql.Tx stored by WithTx
// (directly, or in a watermill-sql adapter).
func ExampleTxFromContext_databaseSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback()

	ctx = outbox.WithTx(ctx, tx)
	if stx, ok := outbox.TxFromContext[*sql.Tx](ctx); ok {
		var n int
		if err := stx.QueryRowContext(ctx, "SELECT 40 + 2").Scan(&n); err != nil {
			panic(err)
		}
		fmt.Println("*sql.Tx:", n)
	}
	_, ok := outbox.TxFromContext[pgx.Tx](ctx)
	fmt.Println("a pgx.Tx too?", ok)
	// Output:
	// *sql.Tx: 42
	// a pgx.Tx too? false
}
