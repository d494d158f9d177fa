package iface

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The sentinel errors cross the process boundary as gRPC status codes:
//
//	ErrNoSlot          codes.NotFound
//	ErrBusy            codes.Aborted (a concurrency conflict: retry later, at a
//	                   higher level; FailedPrecondition would say the caller
//	                   must first repair the system's state)
//	ErrBadRequest      codes.InvalidArgument
//	ErrNotImplemented  codes.Unimplemented (also what gRPC answers for an RPC a
//	                   plugin built against an older protocol lacks)
//	ErrNoRoom          codes.FailedPrecondition (the KV cache the slots share
//	                   is held by other sequences until one is cleared; not
//	                   ResourceExhausted, which gRPC itself answers for an
//	                   oversized message)
//	context.Canceled   codes.Canceled
//	context.DeadlineExceeded codes.DeadlineExceeded
//	anything else      its own status code if it carries one, else codes.Unknown
//
// The status message is the error's full text, so the host sees what the
// plugin said.

// ToStatus converts an error returned by a Backend implementation into the
// gRPC status error the server returns.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	var code codes.Code
	switch {
	case errors.Is(err, ErrNoSlot):
		code = codes.NotFound
	case errors.Is(err, ErrBusy):
		code = codes.Aborted
	case errors.Is(err, ErrBadRequest):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNotImplemented):
		code = codes.Unimplemented
	case errors.Is(err, ErrNoRoom):
		code = codes.FailedPrecondition
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	default:
		// A (possibly wrapped) status error, e.g. a failed stream Send, keeps
		// its code; FromError then uses the full wrapped text as the message.
		if st, ok := status.FromError(err); ok {
			return st.Err()
		}
		code = codes.Unknown
	}
	return status.Error(code, err.Error())
}

// FromStatus converts an error from a gRPC call back into one that matches
// the sentinel it was mapped from (errors.Is) and whose text is the plugin's
// message. Errors that are not gRPC status errors are returned unchanged.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	var sentinel error
	switch st.Code() {
	case codes.OK:
		return nil
	case codes.NotFound:
		sentinel = ErrNoSlot
	case codes.Aborted:
		sentinel = ErrBusy
	case codes.InvalidArgument:
		sentinel = ErrBadRequest
	case codes.Unimplemented:
		sentinel = ErrNotImplemented
	case codes.FailedPrecondition:
		sentinel = ErrNoRoom
	case codes.Canceled:
		sentinel = context.Canceled
	case codes.DeadlineExceeded:
		sentinel = context.DeadlineExceeded
	}
	msg := st.Message()
	switch {
	case sentinel != nil && msg == "":
		msg = sentinel.Error()
	case sentinel != nil && !strings.HasPrefix(msg, sentinel.Error()):
		// The plugin returned e.g. errors.New("slot 9 out of range") for a
		// NotFound status; keep the sentinel's wording in front of it.
		msg = sentinel.Error() + ": " + msg
	case sentinel == nil && st.Code() != codes.Unknown:
		// Transport and other non-sentinel failures (Unavailable when the
		// plugin died, ResourceExhausted for an oversized message) name
		// their code, which the message alone often does not.
		msg = st.Code().String() + ": " + msg
	}
	return &rpcError{st: st, sentinel: sentinel, msg: msg}
}

// rpcError is an error received from the plugin.
type rpcError struct {
	st       *status.Status
	sentinel error // nil when the code maps to none
	msg      string
}

func (e *rpcError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, ErrNoSlot) and the like work on the host side.
func (e *rpcError) Unwrap() error { return e.sentinel }

// GRPCStatus keeps the original status available to status.FromError and
// status.Code.
func (e *rpcError) GRPCStatus() *status.Status { return e.st }
