package treecall

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Every rule, as a table: a call in a state meets a failure.
func TestFailed(t *testing.T) {
	plain := func(c codes.Code) *status.Status { return status.New(c, "x") }
	reason := func(c codes.Code, r string) *status.Status { return status.Convert(ReasonError(c, "x", r)) }
	notApplied := func(c codes.Code) *status.Status { return status.Convert(NotAppliedError(c, "x")) }
	for _, tc := range []struct {
		name string
		call Call
		st   *status.Status
		done bool
		want Decision
		// the call after
		after Call
	}{
		// Reads: anything but an answer goes on.
		{name: "read unavailable", call: Call{Kind: Read}, st: plain(codes.Unavailable), want: Decision{Step: Next}},
		{name: "read unknown", call: Call{Kind: Read}, st: plain(codes.Unknown), want: Decision{Step: Next}},
		{name: "read deadline", call: Call{Kind: Read}, st: plain(codes.DeadlineExceeded), want: Decision{Step: Next}},
		{name: "read not found", call: Call{Kind: Read}, st: plain(codes.NotFound), want: Decision{Step: Answer}},
		{name: "read too large", call: Call{Kind: Read}, st: plain(codes.ResourceExhausted), want: Decision{Step: Answer}},
		{name: "read out of time", call: Call{Kind: Read}, st: plain(codes.Unavailable), done: true, want: Decision{Step: Unavailable}},
		// Untokened writes: only a proof of nothing done goes on.
		{name: "write not applied", call: Call{Kind: Write}, st: notApplied(codes.Unavailable), want: Decision{Step: Next}},
		{name: "write unavailable", call: Call{Kind: Write}, st: plain(codes.Unavailable), want: Decision{Step: Unknown}},
		{name: "write broken", call: Call{Kind: Write}, st: plain(codes.Unknown), want: Decision{Step: Unknown}},
		{name: "write deadline", call: Call{Kind: Write}, st: plain(codes.DeadlineExceeded), want: Decision{Step: Unknown}},
		{name: "write refused", call: Call{Kind: Write}, st: plain(codes.InvalidArgument), want: Decision{Step: Answer}},
		{name: "write store full", call: Call{Kind: Write}, st: notApplied(codes.ResourceExhausted), want: Decision{Step: Answer}},
		{name: "write over a gRPC limit", call: Call{Kind: Write}, st: plain(codes.ResourceExhausted), want: Decision{Step: Unknown}},
		{name: "write not applied out of time", call: Call{Kind: Write}, st: notApplied(codes.Unavailable), done: true, want: Decision{Step: Unavailable}},
		// Tokened writes.
		{name: "tokened broken", call: Call{Kind: Write, Tokened: true}, st: plain(codes.Unknown),
			want: Decision{Step: Next, Resend: true}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "tokened deadline", call: Call{Kind: Write, Tokened: true, Ambiguous: 1}, st: plain(codes.DeadlineExceeded),
			want: Decision{Step: Next, Resend: true}, after: Call{Kind: Write, Tokened: true, Ambiguous: 2}},
		{name: "tokened broken out of time", call: Call{Kind: Write, Tokened: true}, st: plain(codes.Unavailable), done: true,
			want: Decision{Step: Unknown}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "tokened not applied", call: Call{Kind: Write, Tokened: true, Ambiguous: 1}, st: notApplied(codes.Unavailable),
			want: Decision{Step: Next}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "tokened not applied out of time", call: Call{Kind: Write, Tokened: true, Ambiguous: 1}, st: notApplied(codes.Unavailable), done: true,
			want: Decision{Step: Unknown}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "tokened not applied out of time, nothing ambiguous", call: Call{Kind: Write, Tokened: true}, st: notApplied(codes.Unavailable), done: true,
			want: Decision{Step: Unavailable}, after: Call{Kind: Write, Tokened: true}},
		{name: "tokened refused", call: Call{Kind: Write, Tokened: true}, st: plain(codes.InvalidArgument),
			want: Decision{Step: Answer}, after: Call{Kind: Write, Tokened: true}},
		{name: "tokened refused after an ambiguous attempt", call: Call{Kind: Write, Tokened: true, Ambiguous: 2}, st: plain(codes.NotFound),
			want: Decision{Step: Unknown}, after: Call{Kind: Write, Tokened: true, Ambiguous: 2}},
		{name: "tokened store full after an ambiguous attempt", call: Call{Kind: Write, Tokened: true, Ambiguous: 1}, st: notApplied(codes.ResourceExhausted),
			want: Decision{Step: Unknown}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "tokened store full", call: Call{Kind: Write, Tokened: true}, st: notApplied(codes.ResourceExhausted),
			want: Decision{Step: Answer}, after: Call{Kind: Write, Tokened: true}},
		{name: "tokened over a gRPC limit", call: Call{Kind: Write, Tokened: true}, st: plain(codes.ResourceExhausted),
			want: Decision{Step: Next, Resend: true}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "tokens off", call: Call{Kind: Write, Tokened: true}, st: reason(codes.FailedPrecondition, TokensOff),
			want: Decision{Step: Again, Untokened: true}, after: Call{Kind: Write}},
		{name: "old build", call: Call{Kind: Write, Tokened: true}, st: plain(codes.Unimplemented),
			want: Decision{Step: Again, Untokened: true}, after: Call{Kind: Write}},
		{name: "tokens off after an ambiguous attempt", call: Call{Kind: Write, Tokened: true, Ambiguous: 1}, st: reason(codes.FailedPrecondition, TokensOff),
			want: Decision{Step: Unknown}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "old build after an ambiguous attempt", call: Call{Kind: Write, Tokened: true, Ambiguous: 1}, st: plain(codes.Unimplemented),
			want: Decision{Step: Unknown}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "expired first", call: Call{Kind: Write, Tokened: true}, st: reason(codes.FailedPrecondition, TokenExpired),
			want: Decision{Step: Again, NewToken: true}, after: Call{Kind: Write, Tokened: true, Renewed: 1}},
		{name: "expired, renewals spent", call: Call{Kind: Write, Tokened: true, Renewed: MaxRenewals}, st: reason(codes.FailedPrecondition, TokenExpired),
			want: Decision{Step: Answer}, after: Call{Kind: Write, Tokened: true, Renewed: MaxRenewals}},
		{name: "expired after an ambiguous attempt", call: Call{Kind: Write, Tokened: true, Ambiguous: 1}, st: reason(codes.FailedPrecondition, TokenExpired),
			want: Decision{Step: Unknown}, after: Call{Kind: Write, Tokened: true, Ambiguous: 1}},
		{name: "tree changed first", call: Call{Kind: Write, Tokened: true}, st: reason(codes.FailedPrecondition, TreeChanged),
			want: Decision{Step: Again, NewToken: true}, after: Call{Kind: Write, Tokened: true, Renewed: 1}},
		{name: "tree changed after an ambiguous attempt", call: Call{Kind: Write, Tokened: true, Ambiguous: 2}, st: reason(codes.FailedPrecondition, TreeChanged),
			want: Decision{Step: Unknown}, after: Call{Kind: Write, Tokened: true, Ambiguous: 2}},
		{name: "tokens off out of time", call: Call{Kind: Write, Tokened: true}, st: reason(codes.FailedPrecondition, TokensOff), done: true,
			want: Decision{Step: Unavailable, Untokened: true}, after: Call{Kind: Write}},
		{name: "read unimplemented", call: Call{Kind: Read}, st: plain(codes.Unimplemented), want: Decision{Step: Answer}},
		{name: "write unimplemented", call: Call{Kind: Write}, st: plain(codes.Unimplemented), want: Decision{Step: Answer}},
		{name: "expired out of time", call: Call{Kind: Write, Tokened: true}, st: reason(codes.FailedPrecondition, TokenExpired), done: true,
			want: Decision{Step: Unavailable}, after: Call{Kind: Write, Tokened: true, Renewed: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.call
			got := c.Failed(tc.st, tc.done)
			if got != tc.want {
				t.Errorf("decision %+v (%v), want %+v (%v)", got, got.Step, tc.want, tc.want.Step)
			}
			after := tc.after
			if after == (Call{}) {
				after = tc.call
			}
			if c != after {
				t.Errorf("call after %+v, want %+v", c, after)
			}
		})
	}
}

// The attempt number a token carries is 1 exactly while no attempt's
// outcome is unknown.
func TestAttemptNumbers(t *testing.T) {
	c := Call{Kind: Write, Tokened: true}
	if c.Attempt() != 1 {
		t.Fatalf("first attempt %d", c.Attempt())
	}
	c.Failed(status.Convert(NotAppliedError(codes.Unavailable, "x")), false)
	if c.Attempt() != 1 {
		t.Fatalf("after a refusal before any change: attempt %d", c.Attempt())
	}
	c.Failed(status.New(codes.Unavailable, "x"), false)
	c.Failed(status.New(codes.DeadlineExceeded, "x"), false)
	if c.Attempt() != 3 || c.Ended() != Unknown {
		t.Fatalf("after two attempts of unknown outcome: attempt %d, end %v", c.Attempt(), c.Ended())
	}
}
