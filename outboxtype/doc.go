// Package outboxtype holds the types a user of watermill-outbox handles
// beyond the components themselves: the errors with fields (taken apart
// with errors.As), the error values they match (errors.Is), what a
// RejectHandler receives and implements, and the logger with a warning
// level. It is a leaf: it imports nothing of watermill-outbox, so every
// package of the module, and an application's own code, can name its types
// without importing the components.
//
// Package outbox returns these values and re-exports the error values
// under the same identity: outbox.ErrInvalidConfig is ErrInvalidConfig,
// and an error matching it is a *ConfigError:
//
//	var ce *outboxtype.ConfigError
//	if errors.As(err, &ce) {
//		log.Printf("fix %s: %s", ce.Field, ce.Reason)
//	}
package outboxtype
