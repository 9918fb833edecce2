package btree

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRPCErrorNotApplied: only failures marked as coming before any change
// tell the client that a retry is safe; a lease that ran out elsewhere
// leaves a write's outcome unknown.
func TestRPCErrorNotApplied(t *testing.T) {
	cases := []struct {
		err        error
		code       codes.Code
		notApplied bool
	}{
		{refused(errors.New("reading node 1:2: cut off")), codes.Unavailable, true},
		{refused(ErrLeaseExpired), codes.Unavailable, true},
		{ErrLeaseExpired, codes.Unavailable, false},
		{refused(fmt.Errorf("waiting: %w", context.DeadlineExceeded)), codes.DeadlineExceeded, true},
		{context.DeadlineExceeded, codes.DeadlineExceeded, false},
		{refused(fmt.Errorf("%w: x", ErrNoTree)), codes.NotFound, false},
		{errors.New("txn: log flush failed"), codes.Unknown, false},
	}
	for _, c := range cases {
		st := status.Convert(rpcError(c.err))
		if st.Code() != c.code || IsNotApplied(st) != c.notApplied {
			t.Errorf("%v: code %v not-applied %v, want %v %v", c.err, st.Code(), IsNotApplied(st), c.code, c.notApplied)
		}
	}
	if refused(nil) != nil {
		t.Error("refused(nil) is not nil")
	}
	if e := refused(errors.New("x")); !errors.Is(e, ErrNotApplied) || e.Error() != "x" {
		t.Errorf("refused: %v", e)
	}
}
