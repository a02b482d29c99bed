package pgexec

import (
	"context"
	"reflect"
)

type txKey struct{}

// Binding is what WithTx stores in a context: the caller's transaction as
// given, and its adapter (or the error that says why it is not usable).
type Binding struct {
	Tx  any
	Q   Querier
	Err error
}

// WithTx returns a context carrying tx, adapted once here (see FromTx), so
// that an unusable handle is reported by whoever uses the binding.
func WithTx(ctx context.Context, tx any) context.Context {
	q, err := FromTx(tx)
	return context.WithValue(ctx, txKey{}, &Binding{Tx: tx, Q: q, Err: err})
}

// BindingFrom returns the binding WithTx stored in ctx, or nil.
func BindingFrom(ctx context.Context) *Binding {
	if ctx == nil {
		return nil
	}
	b, _ := ctx.Value(txKey{}).(*Binding)
	return b
}

// SameTx reports whether two bindings carry the same transaction.
func SameTx(a, b *Binding) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	ta, tb := reflect.TypeOf(a.Tx), reflect.TypeOf(b.Tx)
	return ta == tb && ta != nil && ta.Comparable() && a.Tx == b.Tx
}
