// Package apicheck holds tests of the library's exported API as a whole,
// which import every library package and so cannot live in any of them:
// nilargs_test.go calls every exported function and method with nil and
// zero arguments and receivers, and fails on a panic, a hang or an untyped
// error; a completeness check parses the packages' sources and fails on an
// exported function or method the table does not call.
//
// The package has no code of its own.
package apicheck
