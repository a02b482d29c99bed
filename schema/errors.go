package schema

import (
	"errors"
	"fmt"
	"strings"

	"github.com/millrace/watermill-outbox/internal/errs"
)

func errNotConstructed() error { return errs.NotConstructed("schema.Codec", "schema.New") }

func errNilHandler() error {
	return errs.NilArgument("schema.Handler: fn", "pass the function that handles the decoded value")
}

func errNilMessage() error {
	return errs.NilArgument("schema.Handler: msg", "the Subscriber delivers messages, never nil")
}

// The kinds of failure, for errors.Is. Every error of the package that is
// not a configuration or argument error (outbox.ErrInvalidConfig,
// outbox.ErrInvalidArgument) is a *SchemaError or a *RegistryError, and
// matches one of these.
var (
	// ErrMismatch: a payload or a Go value does not match its topic's
	// schema (a *SchemaError). Nothing of the Publish call was written.
	ErrMismatch = errors.New("schema: the event does not match its schema")
	// ErrIncompatible: the registry refused a schema as incompatible with
	// the subject's earlier versions under its compatibility level (a
	// *SchemaError whose Details name the fields).
	ErrIncompatible = errors.New("schema: incompatible with the subject's earlier versions")
	// ErrNotRegistered: with RequireRegistered, a schema is not registered
	// under its subject; or a schema id is not known to the registry (a
	// *SchemaError).
	ErrNotRegistered = errors.New("schema: not registered")
	// ErrInvalidSchema: a schema text does not parse, or the registry
	// refuses it as invalid (a *SchemaError).
	ErrInvalidSchema = errors.New("schema: invalid schema")
	// ErrRegistryUnavailable: the registry could not be reached or
	// answered with a server error (a *RegistryError).
	ErrRegistryUnavailable = errors.New("schema: registry unavailable")
)

// SchemaError reports an event or a schema that failed: which topic,
// subject and version, and what failed. Publish returns one (as the whole
// call's error: nothing of the call is written) for a message that does
// not match its topic's schema.
type SchemaError struct {
	// Topic is the outbox topic ("" when the error is not about one).
	Topic string
	// Subject is the registry subject (e.g. "orders-value").
	Subject string
	// Version is the subject's version the event was checked against, 0
	// when unknown (the schema is not registered).
	Version int
	// ID is the schema id, 0 when unknown.
	ID int
	// UUID is the message's UUID when the error is about one message.
	UUID string
	// Reason says what failed and what to do.
	Reason string
	// Details are the registry's compatibility messages, each naming a
	// field and what broke, for ErrIncompatible.
	Details []string
	// Kind is the sentinel the error matches (ErrMismatch, ErrIncompatible,
	// ErrNotRegistered, ErrInvalidSchema).
	Kind error
	// Err is the underlying error (a decoder's, a validator's, the
	// registry's), if any.
	Err error
}

// Error says what failed, where.
func (e *SchemaError) Error() string {
	var b strings.Builder
	b.WriteString(e.kind().Error())
	if e.Topic != "" {
		fmt.Fprintf(&b, ": topic %q", e.Topic)
	}
	if e.Subject != "" {
		fmt.Fprintf(&b, ", subject %q", e.Subject)
	}
	if e.Version > 0 {
		fmt.Fprintf(&b, " version %d", e.Version)
	}
	if e.ID > 0 {
		fmt.Fprintf(&b, " (id %d)", e.ID)
	}
	if e.UUID != "" {
		fmt.Fprintf(&b, ", message %s", e.UUID)
	}
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	if len(e.Details) > 0 {
		b.WriteString(": ")
		b.WriteString(strings.Join(e.Details, "; "))
	} else if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Is matches the error's Kind.
func (e *SchemaError) Is(target error) bool { return target == e.kind() }

// kind is Kind, ErrMismatch when unset.
func (e *SchemaError) kind() error {
	if e.Kind == nil {
		return ErrMismatch
	}
	return e.Kind
}

// Unwrap returns the underlying error.
func (e *SchemaError) Unwrap() error { return e.Err }

// RegistryError reports a registry that could not be reached or answered
// with a server error. It matches ErrRegistryUnavailable.
type RegistryError struct {
	// Op says what was asked ("register subject orders-value").
	Op string
	// URLs are the registry's addresses.
	URLs []string
	// Err is the client's error.
	Err error
}

// Error says what failed and what to run.
func (e *RegistryError) Error() string {
	return fmt.Sprintf("%v: %s at %s: %v (start the schema registry, or point schema.Config.Client at one that runs: sr.URLs(...))",
		ErrRegistryUnavailable, e.Op, strings.Join(e.URLs, ", "), e.Err)
}

// Is matches ErrRegistryUnavailable.
func (e *RegistryError) Is(target error) bool { return target == ErrRegistryUnavailable }

// Unwrap returns the client's error.
func (e *RegistryError) Unwrap() error { return e.Err }
