// Package treecall holds the rules by which a caller of the B-tree service
// goes on after an attempt of a call failed: which failures are the call's
// answer, which let it try another node, and when a write's outcome is
// unknown. It does no I/O (the lint test keeps it so): the Go client
// (package client) runs these rules against real nodes, and the B-tree
// simulator runs the same ones against its servers, so that what the
// simulator checks is what clients do.
//
// The rules rest on what a failure proves (the reasons below, carried in
// an errdetails.ErrorInfo of domain "grove"):
//   - NOT_APPLIED proves that the attempt changed nothing (refused before
//     it started): any call may be sent again, elsewhere.
//   - Any other failure of a write that is not an answer (a broken
//     connection, a deadline, a node dying mid-call) leaves its outcome
//     unknown. An untokened write ends there (Unknown); a tokened write
//     (RIFL: a write token, whose completion record a server keeps in the
//     leaf) is sent again under the same token, which the server answers
//     from the record if an earlier attempt took effect.
//   - An answer that refuses a tokened write (no such tree, a full store)
//     says only that this attempt did nothing: after an attempt of unknown
//     outcome, the write's outcome stays unknown.
//   - TOKEN_EXPIRED says that the attempt did nothing and that the write's
//     record, if it had one, is gone: the write did nothing only if no
//     earlier attempt's outcome was unknown.
//   - TOKENS_OFF (or Unimplemented, a build from before tokens) says that
//     the cluster takes no tokened writes: the write goes untokened, unless
//     an earlier tokened attempt's outcome is unknown (then it cannot: an
//     untokened resend could apply twice).
package treecall

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons (ErrorInfo, domain "grove").
const (
	// NotApplied: the call changed nothing; it was refused before it
	// started (the node's B-tree server is not running). A client may
	// send a write that failed so elsewhere; any other failure of a write
	// leaves its outcome unknown.
	NotApplied = "NOT_APPLIED"
	// TokensOff: not every registered node's build keeps completion
	// records yet: the client sends the write untokened.
	TokensOff = "TOKENS_OFF"
	// TokenExpired: the attempt came too late (past the token window, at
	// or below its leaf's horizon, or stamped in the future) and did
	// nothing; the write did nothing if no other attempt of it was sent.
	TokenExpired = "TOKEN_EXPIRED"
	// TreeChanged: the token names another tree than the one now under
	// its name (dropped and made again since the client looked it up):
	// this attempt did nothing; the write did nothing if no other attempt
	// of it was sent. The client looks the tree up again before a new
	// token's first attempt.
	TreeChanged = "TREE_CHANGED"
)

// ReasonError is a gRPC error of code carrying reason.
func ReasonError(code codes.Code, msg, reason string) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "grove"}); err == nil {
		return d.Err()
	}
	return st.Err()
}

// HasReason reports whether st carries reason.
func HasReason(st *status.Status, reason string) bool {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == "grove" && info.Reason == reason {
			return true
		}
	}
	return false
}

// NotAppliedError is a gRPC error of code carrying NotApplied.
func NotAppliedError(code codes.Code, msg string) error {
	return ReasonError(code, msg, NotApplied)
}

// IsNotApplied reports whether st carries NotApplied.
func IsNotApplied(st *status.Status) bool { return HasReason(st, NotApplied) }

// Final reports whether code is an answer: the call was carried out or
// refused as a whole (for a write: refused, nothing done).
func Final(c codes.Code) bool {
	switch c {
	case codes.NotFound, codes.AlreadyExists, codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition, codes.Unimplemented, codes.PermissionDenied, codes.ResourceExhausted:
		return true
	}
	return false
}

// Kind says how a call may be retried.
type Kind int

const (
	// Read is a call that changes nothing (get, scan, count, stat, list):
	// sent again elsewhere after any failure that is not an answer.
	Read Kind = iota
	// Write changes the tree or the directory (put, delete, create,
	// drop): sent again only where the rules above allow.
	Write
)

// Step is what a call does after an attempt failed.
type Step int

const (
	// Next: send the call again, to the next node (nothing was done, or
	// the write's token will find an earlier attempt's record).
	Next Step = iota
	// Again: send it again at once to the same node, as Decision says
	// (untokened, or under a new token): the attempt did nothing.
	Again
	// Answer: the failure is the call's answer (for a write: nothing was
	// done).
	Answer
	// Unknown: the write's outcome is unknown; it may yet take effect.
	Unknown
	// Unavailable: the call's time ran out and nothing was done.
	Unavailable
)

func (s Step) String() string {
	switch s {
	case Next:
		return "next"
	case Again:
		return "again"
	case Answer:
		return "answer"
	case Unknown:
		return "unknown"
	case Unavailable:
		return "unavailable"
	}
	return "step?"
}

// MaxRenewals bounds the new tokens a write takes after its first attempt
// was refused as too old (a client clock far from the servers' fails fast
// rather than for ever).
const MaxRenewals = 3

// Call is one call's state across its attempts. A tokened write's token
// (client id, sequence number, stamp) is the caller's; Call says when to
// replace it and which attempt number it carries.
type Call struct {
	Kind Kind
	// Tokened: a put or delete sent under a write token. Failed may turn
	// it off (Decision.Untokened).
	Tokened bool
	// Ambiguous counts the attempts of unknown outcome so far (a tokened
	// write's only; an untokened write ends at its first).
	Ambiguous uint32
	// Renewed counts the new tokens taken (Decision.NewToken).
	Renewed int
}

// Attempt is the attempt number the next attempt's token carries: 1 says
// that no earlier attempt may still take effect (see TokenExpired).
func (c *Call) Attempt() uint32 { return c.Ambiguous + 1 }

// Decision is Failed's answer.
type Decision struct {
	Step Step
	// Untokened (with Again): the cluster takes no tokened writes; send
	// this write untokened (and, the client's policy, others for a while).
	Untokened bool
	// NewToken (with Again): send the write under a new token (a new
	// sequence number and stamp), attempt 1.
	NewToken bool
	// Resend (with Next): the next attempt resends a tokened write whose
	// outcome is unknown.
	Resend bool
}

// Failed decides what follows an attempt that failed with st; done says
// that the call's context has ended (no attempt follows: Next becomes
// Unknown or Unavailable).
func (c *Call) Failed(st *status.Status, done bool) Decision {
	d := c.failed(st)
	if done && (d.Step == Next || d.Step == Again) {
		// (Untokened still says what the cluster answered: the client
		// turns tokens off for its next writes.)
		d = Decision{Step: c.Ended(), Untokened: d.Untokened}
	}
	return d
}

func (c *Call) failed(st *status.Status) Decision {
	code := st.Code()
	if c.Tokened {
		switch {
		case code == codes.Unimplemented || HasReason(st, TokensOff):
			// A build from before tokens, or a cluster with one: this
			// attempt did nothing. Untokened only if no earlier attempt
			// may still take effect.
			if c.Ambiguous > 0 {
				return Decision{Step: Unknown}
			}
			c.Tokened = false
			return Decision{Step: Again, Untokened: true}
		case HasReason(st, TokenExpired) || HasReason(st, TreeChanged):
			if c.Ambiguous > 0 {
				// The record may be gone, or in the tree dropped.
				return Decision{Step: Unknown}
			}
			if c.Renewed >= MaxRenewals {
				return Decision{Step: Answer}
			}
			c.Renewed++
			return Decision{Step: Again, NewToken: true}
		case code == codes.ResourceExhausted && !IsNotApplied(st):
			// Not marked: gRPC's own limits, past the node's checks (the
			// node marks its own refusals, a full store): unknown.
		case Final(code):
			// A refusal says that this attempt did nothing, not that an
			// earlier one of unknown outcome did not take effect: the tree
			// dropped since, a store full for this attempt's value chunk.
			// (Found by the simulator once it ran these rules: an attempt
			// that applied, its answer lost, then a resend refused as "no
			// such tree" was reported as a refusal.)
			if c.Ambiguous > 0 {
				return Decision{Step: Unknown}
			}
			return Decision{Step: Answer}
		case IsNotApplied(st):
			return Decision{Step: Next}
		}
		// Unknown outcome: it may still take effect until the window
		// ends, and the next attempt says so.
		c.Ambiguous++
		return Decision{Step: Next, Resend: true}
	}
	if Final(code) {
		if code == codes.ResourceExhausted && c.Kind == Write && !IsNotApplied(st) {
			return Decision{Step: Unknown}
		}
		return Decision{Step: Answer}
	}
	if c.Kind == Write && !IsNotApplied(st) {
		return Decision{Step: Unknown}
	}
	return Decision{Step: Next}
}

// Ended is the call's end when its time ran out before an answer: Unknown
// if an attempt's outcome is, Unavailable (nothing done) otherwise.
func (c *Call) Ended() Step {
	if c.Ambiguous > 0 {
		return Unknown
	}
	return Unavailable
}
