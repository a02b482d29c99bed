package outboxtype

import "github.com/ThreeDotsLabs/watermill"

// WarnLogger is implemented by a watermill.LoggerAdapter that has a warning
// level. Watermill's interface has none, so watermill-outbox logs its
// warnings (a configuration that can stall a partition, for example)
// through Warn when the logger has it, and at Error level otherwise.
type WarnLogger interface {
	Warn(msg string, fields watermill.LogFields)
}
