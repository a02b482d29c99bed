package apicheck_test

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/outboxtype"
)

// typesEntries sweep package outboxtype: the methods of its error types on
// zero values, and a nil RejectHandlerFunc.
var typesEntries = []entry{
	{"outboxtype.ConfigError.Error", func(e *env) { e.call("ConfigError{}.Error", func() { _ = new(outboxtype.ConfigError).Error() }) }},
	{"outboxtype.ConfigError.Is", func(e *env) { e.call("ConfigError{}.Is", func() { _ = new(outboxtype.ConfigError).Is(nil) }) }},
	{"outboxtype.HandlerTimeoutError.Error", func(e *env) {
		e.call("HandlerTimeoutError{}.Error", func() { _ = new(outboxtype.HandlerTimeoutError).Error() })
	}},
	{"outboxtype.HandlerTimeoutError.Is", func(e *env) {
		e.call("HandlerTimeoutError{}.Is", func() { _ = new(outboxtype.HandlerTimeoutError).Is(nil) })
	}},
	{"outboxtype.LimitError.Error", func(e *env) { e.call("LimitError{}.Error", func() { _ = new(outboxtype.LimitError).Error() }) }},
	{"outboxtype.LimitError.Is", func(e *env) { e.call("LimitError{}.Is", func() { _ = new(outboxtype.LimitError).Is(nil) }) }},
	{"outboxtype.MessageError.Error", func(e *env) { e.call("MessageError{}.Error", func() { _ = new(outboxtype.MessageError).Error() }) }},
	{"outboxtype.MessageError.Is", func(e *env) { e.call("MessageError{}.Is", func() { _ = new(outboxtype.MessageError).Is(nil) }) }},
	{"outboxtype.MessageError.Unwrap", func(e *env) {
		e.call("MessageError{}.Unwrap", func() { _ = new(outboxtype.MessageError).Unwrap() })
	}},
	{"outboxtype.NameError.Error", func(e *env) { e.call("NameError{}.Error", func() { _ = new(outboxtype.NameError).Error() }) }},
	{"outboxtype.NameError.Is", func(e *env) { e.call("NameError{}.Is", func() { _ = new(outboxtype.NameError).Is(nil) }) }},
	{"outboxtype.NotInTxError.Error", func(e *env) { e.call("NotInTxError{}.Error", func() { _ = new(outboxtype.NotInTxError).Error() }) }},
	{"outboxtype.NotInTxError.Is", func(e *env) { e.call("NotInTxError{}.Is", func() { _ = new(outboxtype.NotInTxError).Is(nil) }) }},
	{"outboxtype.NotMigratedError.Error", func(e *env) {
		e.call("NotMigratedError{}.Error", func() { _ = new(outboxtype.NotMigratedError).Error() })
	}},
	{"outboxtype.NotMigratedError.Is", func(e *env) { e.call("NotMigratedError{}.Is", func() { _ = new(outboxtype.NotMigratedError).Is(nil) }) }},
	{"outboxtype.NotMigratedError.Unwrap", func(e *env) {
		e.call("NotMigratedError{}.Unwrap", func() { _ = new(outboxtype.NotMigratedError).Unwrap() })
	}},
	{"outboxtype.PartitionMismatchError.Error", func(e *env) {
		e.call("PartitionMismatchError{}.Error", func() { _ = new(outboxtype.PartitionMismatchError).Error() })
	}},
	{"outboxtype.PartitionMismatchError.Is", func(e *env) {
		e.call("PartitionMismatchError{}.Is", func() { _ = new(outboxtype.PartitionMismatchError).Is(nil) })
	}},
	{"outboxtype.PayloadMissingError.Error", func(e *env) {
		e.call("PayloadMissingError{}.Error", func() { _ = new(outboxtype.PayloadMissingError).Error() })
	}},
	{"outboxtype.PayloadMissingError.Is", func(e *env) {
		e.call("PayloadMissingError{}.Is", func() { _ = new(outboxtype.PayloadMissingError).Is(nil) })
	}},
	{"outboxtype.PayloadTooLargeError.Error", func(e *env) {
		e.call("PayloadTooLargeError{}.Error", func() { _ = new(outboxtype.PayloadTooLargeError).Error() })
	}},
	{"outboxtype.PayloadTooLargeError.Is", func(e *env) {
		e.call("PayloadTooLargeError{}.Is", func() { _ = new(outboxtype.PayloadTooLargeError).Is(nil) })
	}},
	{"outboxtype.RejectHandlerFunc.HandleReject", func(e *env) {
		e.fails("RejectHandlerFunc(nil).HandleReject", func() error {
			return outboxtype.RejectHandlerFunc(nil).HandleReject(e.ctx, nil, outboxtype.RejectedMessage{})
		})
		e.call("RejectHandlerFunc(fn).HandleReject(nil tx, zero message)", func() {
			_ = outboxtype.RejectHandlerFunc(func(context.Context, pgx.Tx, outboxtype.RejectedMessage) error { return nil }).HandleReject(e.ctx, nil, outboxtype.RejectedMessage{})
		})
	}},
	{"outboxtype.SchemaVersionError.Error", func(e *env) {
		e.call("SchemaVersionError{}.Error", func() { _ = new(outboxtype.SchemaVersionError).Error() })
	}},
	{"outboxtype.SchemaVersionError.Is", func(e *env) {
		e.call("SchemaVersionError{}.Is", func() { _ = new(outboxtype.SchemaVersionError).Is(nil) })
	}},
	{"outboxtype.TxMisuseError.Error", func(e *env) { e.call("TxMisuseError{}.Error", func() { _ = new(outboxtype.TxMisuseError).Error() }) }},
	{"outboxtype.TxMisuseError.Is", func(e *env) { e.call("TxMisuseError{}.Is", func() { _ = new(outboxtype.TxMisuseError).Is(nil) }) }},
	{"outboxtype.TxMisuseError.Unwrap", func(e *env) { e.call("TxMisuseError{}.Unwrap", func() { _ = new(outboxtype.TxMisuseError).Unwrap() }) }},
}
