package lock

import (
	"errors"
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Limits on session messages, beyond MaxNameLen.
const (
	MaxHelloLeases   = MaxCachedLeases // leases one clerk may report holding or wanting
	MaxKindLen       = 64
	MaxSessionMsgLen = 32 << 20 // a Hello of MaxCachedLeases leases of MaxNameLen bytes fits
)

// ErrBadMessage wraps every decoding failure: the message is dropped (and
// the session closed) with this reason, and nothing changes.
var ErrBadMessage = errors.New("lock: malformed message")

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadMessage, fmt.Sprintf(format, args...))
}

func modeToPB(m Mode) pb.LockMode { return pb.LockMode(m) }

func modeFromPB(m pb.LockMode, allowNone bool) (Mode, error) {
	switch m {
	case pb.LockMode_LOCK_MODE_SHARED:
		return Shared, nil
	case pb.LockMode_LOCK_MODE_EXCLUSIVE:
		return Exclusive, nil
	case pb.LockMode_LOCK_MODE_UNSPECIFIED:
		if allowNone {
			return None, nil
		}
	}
	return None, bad("mode %v", m)
}

// ClerkIDToPB and ClerkIDFromPB convert clerk ids.
func ClerkIDToPB(c ClerkID) *pb.ClerkId {
	return &pb.ClerkId{Node: c.Node, Incarnation: c.Inc, Seq: c.Seq}
}

func ClerkIDFromPB(c *pb.ClerkId) (ClerkID, error) {
	if c == nil || c.Node == 0 || c.Incarnation == 0 || c.Seq == 0 {
		return ClerkID{}, bad("clerk id %v", c)
	}
	return ClerkID{Node: c.Node, Inc: c.Incarnation, Seq: c.Seq}, nil
}

func name(b []byte) (string, error) {
	if err := ValidName(string(b)); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	return string(b), nil
}

// TokenToPB and TokenFromPB convert fencing tokens.
func TokenToPB(t Token) *pb.Token {
	if t.IsZero() {
		return nil
	}
	return &pb.Token{Epoch: uint64(t.Epoch), Seq: t.Seq}
}

func TokenFromPB(t *pb.Token) Token { return Token{Epoch: Epoch(t.GetEpoch()), Seq: t.GetSeq()} }

// EncodeClerkMessage converts a clerk-to-master message to protobuf.
func EncodeClerkMessage(msg any) *pb.SessionRequest {
	switch x := msg.(type) {
	case Hello:
		h := &pb.LockHello{Clerk: ClerkIDToPB(x.Clerk), Kind: x.Kind, Epoch: uint64(x.Epoch)}
		for _, n := range sortedKeys(x.Held) {
			h.Held = append(h.Held, &pb.HeldLease{Name: []byte(n), Mode: modeToPB(x.Held[n]), Token: TokenToPB(x.Tokens[n])})
		}
		for _, n := range sortedKeys(x.Want) {
			h.Want = append(h.Want, &pb.WantedLease{Name: []byte(n), Mode: modeToPB(x.Want[n])})
		}
		dead := make([]ClerkID, 0, len(x.Recovering))
		for d := range x.Recovering {
			dead = append(dead, d)
		}
		sortIDs(dead)
		for _, d := range dead {
			h.Recovering = append(h.Recovering, &pb.RunningRecovery{Dead: ClerkIDToPB(d), Token: TokenToPB(x.Recovering[d])})
		}
		return &pb.SessionRequest{Msg: &pb.SessionRequest_Hello{Hello: h}}
	case Acquire:
		return &pb.SessionRequest{Msg: &pb.SessionRequest_Acquire{Acquire: &pb.LockAcquire{Name: []byte(x.Name), Mode: modeToPB(x.Mode)}}}
	case Release:
		return &pb.SessionRequest{Msg: &pb.SessionRequest_Release{Release: &pb.LockRelease{Name: []byte(x.Name), Mode: modeToPB(x.Mode), Token: TokenToPB(x.Token)}}}
	case RecoveryDone:
		return &pb.SessionRequest{Msg: &pb.SessionRequest_RecoveryDone{RecoveryDone: &pb.LockRecoveryDone{Dead: ClerkIDToPB(x.Dead), Ok: x.OK, Token: TokenToPB(x.Token)}}}
	case RenewRecovery:
		return &pb.SessionRequest{Msg: &pb.SessionRequest_RenewRecovery{RenewRecovery: &pb.LockRenewRecovery{Dead: ClerkIDToPB(x.Dead), Token: TokenToPB(x.Token)}}}
	case Goodbye:
		return &pb.SessionRequest{Msg: &pb.SessionRequest_Goodbye{Goodbye: &pb.LockGoodbye{}}}
	case Withdraw:
		return &pb.SessionRequest{Msg: &pb.SessionRequest_Withdraw{Withdraw: &pb.LockWithdraw{Name: []byte(x.Name)}}}
	}
	panic(fmt.Sprintf("lock: not a clerk message: %T", msg))
}

// DecodeClerkMessage validates and converts a clerk-to-master message.
func DecodeClerkMessage(m *pb.SessionRequest) (any, error) {
	switch x := m.GetMsg().(type) {
	case *pb.SessionRequest_Hello:
		h := x.Hello
		id, err := ClerkIDFromPB(h.GetClerk())
		if err != nil {
			return nil, err
		}
		if len(h.Kind) > MaxKindLen || len(h.Held) > MaxHelloLeases || len(h.Want) > MaxHelloLeases || len(h.Recovering) > MaxHelloLeases {
			return nil, bad("hello over limits")
		}
		out := Hello{Clerk: id, Kind: h.Kind, Epoch: Epoch(h.Epoch), Held: map[string]Mode{}, Tokens: map[string]Token{}, Want: map[string]Mode{}, Recovering: map[ClerkID]Token{}}
		for _, l := range h.Held {
			n, err := name(l.Name)
			if err != nil {
				return nil, err
			}
			md, err := modeFromPB(l.Mode, false)
			if err != nil {
				return nil, err
			}
			if _, dup := out.Held[n]; dup {
				return nil, bad("lease %q reported twice", n)
			}
			out.Held[n] = md
			out.Tokens[n] = TokenFromPB(l.Token)
		}
		for _, l := range h.Want {
			n, err := name(l.Name)
			if err != nil {
				return nil, err
			}
			md, err := modeFromPB(l.Mode, false)
			if err != nil {
				return nil, err
			}
			out.Want[n] = md
		}
		for _, r := range h.Recovering {
			d, err := ClerkIDFromPB(r.Dead)
			if err != nil {
				return nil, err
			}
			out.Recovering[d] = TokenFromPB(r.Token)
		}
		return out, nil
	case *pb.SessionRequest_Acquire:
		n, err := name(x.Acquire.Name)
		if err != nil {
			return nil, err
		}
		md, err := modeFromPB(x.Acquire.Mode, false)
		if err != nil {
			return nil, err
		}
		return Acquire{Name: n, Mode: md}, nil
	case *pb.SessionRequest_Release:
		n, err := name(x.Release.Name)
		if err != nil {
			return nil, err
		}
		md, err := modeFromPB(x.Release.Mode, true)
		if err != nil || md == Exclusive {
			return nil, bad("release keeps mode %v", x.Release.Mode)
		}
		return Release{Name: n, Mode: md, Token: TokenFromPB(x.Release.Token)}, nil
	case *pb.SessionRequest_Goodbye:
		return Goodbye{}, nil
	case *pb.SessionRequest_Withdraw:
		n, err := name(x.Withdraw.GetName())
		if err != nil {
			return nil, err
		}
		return Withdraw{Name: n}, nil
	case *pb.SessionRequest_RecoveryDone:
		id, err := ClerkIDFromPB(x.RecoveryDone.Dead)
		if err != nil {
			return nil, err
		}
		return RecoveryDone{Dead: id, OK: x.RecoveryDone.Ok, Token: TokenFromPB(x.RecoveryDone.Token)}, nil
	case *pb.SessionRequest_RenewRecovery:
		id, err := ClerkIDFromPB(x.RenewRecovery.GetDead())
		if err != nil {
			return nil, err
		}
		t := TokenFromPB(x.RenewRecovery.GetToken())
		if t.IsZero() {
			return nil, bad("renew recovery without a token")
		}
		return RenewRecovery{Dead: id, Token: t}, nil
	}
	return nil, bad("empty or unknown clerk message")
}

// EncodeMasterMessage converts a master-to-clerk message to protobuf.
func EncodeMasterMessage(msg any) *pb.SessionResponse {
	switch x := msg.(type) {
	case Welcome:
		return &pb.SessionResponse{Msg: &pb.SessionResponse_Welcome{Welcome: &pb.LockWelcome{Epoch: uint64(x.Epoch)}}}
	case Reject:
		return &pb.SessionResponse{Msg: &pb.SessionResponse_Reject{Reject: &pb.LockReject{Reason: x.Reason, Dead: x.Dead}}}
	case Grant:
		return &pb.SessionResponse{Msg: &pb.SessionResponse_Grant{Grant: &pb.LockGrant{Name: []byte(x.Name), Mode: modeToPB(x.Mode), Token: TokenToPB(x.Token)}}}
	case Revoke:
		return &pb.SessionResponse{Msg: &pb.SessionResponse_Revoke{Revoke: &pb.LockRevoke{Name: []byte(x.Name), Keep: modeToPB(x.Keep)}}}
	case Recover:
		r := &pb.LockRecover{Dead: ClerkIDToPB(x.Dead), All: x.All, Token: TokenToPB(x.Token)}
		for _, n := range x.Names {
			r.Names = append(r.Names, []byte(n))
		}
		for _, n := range x.Exclude {
			r.Exclude = append(r.Exclude, []byte(n))
		}
		return &pb.SessionResponse{Msg: &pb.SessionResponse_Recover{Recover: r}}
	case RecoveryRenewed:
		return &pb.SessionResponse{Msg: &pb.SessionResponse_RecoveryRenewed{RecoveryRenewed: &pb.LockRecoveryRenewed{Dead: ClerkIDToPB(x.Dead), Old: TokenToPB(x.Old), Token: TokenToPB(x.Token)}}}
	}
	panic(fmt.Sprintf("lock: not a master message: %T", msg))
}

// DecodeMasterMessage validates and converts a master-to-clerk message.
func DecodeMasterMessage(m *pb.SessionResponse) (any, error) {
	switch x := m.GetMsg().(type) {
	case *pb.SessionResponse_Welcome:
		return Welcome{Epoch: Epoch(x.Welcome.Epoch)}, nil
	case *pb.SessionResponse_Reject:
		return Reject{Reason: x.Reject.Reason, Dead: x.Reject.Dead}, nil
	case *pb.SessionResponse_Grant:
		n, err := name(x.Grant.Name)
		if err != nil {
			return nil, err
		}
		md, err := modeFromPB(x.Grant.Mode, false)
		if err != nil {
			return nil, err
		}
		t := TokenFromPB(x.Grant.Token)
		if t.IsZero() {
			return nil, bad("grant of %q without a token", n)
		}
		return Grant{Name: n, Mode: md, Token: t}, nil
	case *pb.SessionResponse_Revoke:
		n, err := name(x.Revoke.Name)
		if err != nil {
			return nil, err
		}
		md, err := modeFromPB(x.Revoke.Keep, true)
		if err != nil || md == Exclusive {
			return nil, bad("revoke keeps mode %v", x.Revoke.Keep)
		}
		return Revoke{Name: n, Keep: md}, nil
	case *pb.SessionResponse_Recover:
		id, err := ClerkIDFromPB(x.Recover.Dead)
		if err != nil {
			return nil, err
		}
		if len(x.Recover.Names) > MaxRecoverNames || len(x.Recover.Exclude) > MaxRecoverNames {
			return nil, bad("recover lists %d names and %d exclusions", len(x.Recover.Names), len(x.Recover.Exclude))
		}
		r := Recover{Dead: id, All: x.Recover.All, Token: TokenFromPB(x.Recover.Token)}
		if r.Token.IsZero() {
			return nil, bad("recover without a token")
		}
		for _, b := range x.Recover.Names {
			n, err := name(b)
			if err != nil {
				return nil, err
			}
			r.Names = append(r.Names, n)
		}
		for _, b := range x.Recover.Exclude {
			n, err := name(b)
			if err != nil {
				return nil, err
			}
			r.Exclude = append(r.Exclude, n)
		}
		return r, nil
	case *pb.SessionResponse_RecoveryRenewed:
		id, err := ClerkIDFromPB(x.RecoveryRenewed.GetDead())
		if err != nil {
			return nil, err
		}
		r := RecoveryRenewed{Dead: id, Old: TokenFromPB(x.RecoveryRenewed.GetOld()), Token: TokenFromPB(x.RecoveryRenewed.GetToken())}
		if r.Old.IsZero() || !r.Token.IsZero() && !r.Old.Less(r.Token) {
			return nil, bad("recovery renewed from %v to %v", r.Old, r.Token)
		}
		return r, nil
	}
	return nil, bad("empty or unknown master message")
}

// DecodeSessionRequest parses raw bytes (for fuzzing and defensive use).
func DecodeSessionRequest(b []byte) (any, error) {
	if len(b) > MaxSessionMsgLen {
		return nil, bad("%d bytes", len(b))
	}
	m := &pb.SessionRequest{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, bad("%v", err)
	}
	return DecodeClerkMessage(m)
}

// DecodeSessionResponse parses raw bytes.
func DecodeSessionResponse(b []byte) (any, error) {
	if len(b) > MaxSessionMsgLen {
		return nil, bad("%d bytes", len(b))
	}
	m := &pb.SessionResponse{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, bad("%v", err)
	}
	return DecodeMasterMessage(m)
}

func sortIDs(ids []ClerkID) {
	sort.Slice(ids, func(i, j int) bool { return ids[i].Less(ids[j]) })
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
