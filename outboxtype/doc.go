// Package outboxtype holds the types a user of watermill-outbox handles
// beyond the components themselves: the errors with fields (taken apart
// with errors.As), what a RejectHandler receives and implements, and the
// logger with a warning level. It is a leaf: it imports no component of
// watermill-outbox, so every package of the module, and an application's
// own code, can name its types without importing the components.
//
// The error values these types match (errors.Is) are package outbox's:
// an error matching outbox.ErrInvalidConfig is a *ConfigError:
//
//	var ce *outboxtype.ConfigError
//	if errors.As(err, &ce) {
//		log.Printf("fix %s: %s", ce.Field, ce.Reason)
//	}
package outboxtype
