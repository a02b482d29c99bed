// Package warnlog logs warnings through a watermill.LoggerAdapter, whose
// interface has no warning level: through the logger's Warn method when it
// has one (Logger), and at Error level otherwise. The root package and
// package retention share it.
package warnlog

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/outboxtype"
)

// Logger is implemented by a watermill.LoggerAdapter that has a warning
// level (outboxtype.WarnLogger).
type Logger = outboxtype.WarnLogger

// ErrWarning is the error a warning is logged with on a logger without
// Warn.
var ErrWarning = errors.New("outbox: warning")

// Warn logs msg at warning level on the first of loggers that has Warn
// (nil entries are skipped), else at Error level on the first one.
// fields are added to the entry either way.
func Warn(msg string, fields watermill.LogFields, loggers ...watermill.LoggerAdapter) {
	for _, l := range loggers {
		if w, ok := l.(Logger); ok {
			w.Warn(msg, fields)
			return
		}
	}
	if len(loggers) > 0 && loggers[0] != nil {
		loggers[0].Error(msg, ErrWarning, fields)
	}
}
