package lock

import (
	"errors"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

func TestWireRoundTrip(t *testing.T) {
	clerkMsgs := []any{
		Hello{Clerk: cA, Kind: "wal", Epoch: 3, Held: map[string]Mode{"a": Shared, "b\x00c": Exclusive}, Tokens: map[string]Token{"a": {1, 2}, "b\x00c": {3, 5}},
			Want: map[string]Mode{"d": Exclusive}, Recovering: map[ClerkID]Token{cC: {2, 9}}},
		Acquire{"x", Shared}, Release{"x", None, Token{1, 4}}, Release{"x", Shared, Token{2, 5}}, RecoveryDone{cB, true, Token{3, 1}},
		RenewRecovery{cB, Token{3, 1}},
	}
	for _, m := range clerkMsgs {
		b, _ := proto.Marshal(EncodeClerkMessage(m))
		got, err := DecodeSessionRequest(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("%#v → %#v, %v", m, got, err)
		}
	}
	masterMsgs := []any{Welcome{2}, Reject{"no", true}, Grant{"x", Exclusive, Token{2, 7}}, Revoke{"x", Shared}, Recover{Dead: cC, Names: []string{"p", "q"}, Token: Token{1, 1}}, Recover{Dead: cC, All: true, Token: Token{4, 2}},
		RecoveryRenewed{Dead: cC, Old: Token{4, 2}, Token: Token{4, 9}}, RecoveryRenewed{Dead: cC, Old: Token{4, 2}}}
	for _, m := range masterMsgs {
		b, _ := proto.Marshal(EncodeMasterMessage(m))
		got, err := DecodeSessionResponse(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("%#v → %#v, %v", m, got, err)
		}
	}
}

func TestWireRejects(t *testing.T) {
	long := make([]byte, MaxNameLen+1)
	bads := []*pb.SessionRequest{
		{},
		{Msg: &pb.SessionRequest_Acquire{Acquire: &pb.LockAcquire{Name: nil, Mode: pb.LockMode_LOCK_MODE_SHARED}}},
		{Msg: &pb.SessionRequest_Acquire{Acquire: &pb.LockAcquire{Name: long, Mode: pb.LockMode_LOCK_MODE_SHARED}}},
		{Msg: &pb.SessionRequest_Acquire{Acquire: &pb.LockAcquire{Name: []byte("x")}}},
		{Msg: &pb.SessionRequest_Acquire{Acquire: &pb.LockAcquire{Name: []byte("x"), Mode: 7}}},
		{Msg: &pb.SessionRequest_Release{Release: &pb.LockRelease{Name: []byte("x"), Mode: pb.LockMode_LOCK_MODE_EXCLUSIVE}}},
		{Msg: &pb.SessionRequest_Hello{Hello: &pb.LockHello{}}},
		{Msg: &pb.SessionRequest_Hello{Hello: &pb.LockHello{Clerk: &pb.ClerkId{Node: 1, Incarnation: 1, Seq: 1},
			Held: []*pb.HeldLease{{Name: []byte("a"), Mode: 1}, {Name: []byte("a"), Mode: 2}}}}},
		{Msg: &pb.SessionRequest_RecoveryDone{RecoveryDone: &pb.LockRecoveryDone{}}},
		{Msg: &pb.SessionRequest_Hello{Hello: &pb.LockHello{Clerk: &pb.ClerkId{Node: 1, Incarnation: 1, Seq: 1},
			Recovering: []*pb.RunningRecovery{{Dead: &pb.ClerkId{}}}}}},
		{Msg: &pb.SessionRequest_RenewRecovery{RenewRecovery: &pb.LockRenewRecovery{Dead: &pb.ClerkId{Node: 1, Incarnation: 1, Seq: 1}}}}, // no token
	}
	for i, m := range bads {
		if _, err := DecodeClerkMessage(m); !errors.Is(err, ErrBadMessage) {
			t.Errorf("bad clerk message %d accepted: %v", i, err)
		}
	}
	if _, err := DecodeSessionRequest([]byte{0xff, 0xff}); !errors.Is(err, ErrBadMessage) {
		t.Errorf("garbage accepted: %v", err)
	}
	badResponses := []*pb.SessionResponse{
		{},
		{Msg: &pb.SessionResponse_Grant{Grant: &pb.LockGrant{Name: []byte("x"), Mode: pb.LockMode_LOCK_MODE_SHARED}}},    // no token
		{Msg: &pb.SessionResponse_Recover{Recover: &pb.LockRecover{Dead: &pb.ClerkId{Node: 1, Incarnation: 1, Seq: 1}}}}, // no token
		{Msg: &pb.SessionResponse_Revoke{Revoke: &pb.LockRevoke{Name: []byte("x"), Keep: pb.LockMode_LOCK_MODE_EXCLUSIVE}}},
		{Msg: &pb.SessionResponse_RecoveryRenewed{RecoveryRenewed: &pb.LockRecoveryRenewed{Dead: &pb.ClerkId{Node: 1, Incarnation: 1, Seq: 1}, // not newer
			Old: &pb.Token{Epoch: 2, Seq: 5}, Token: &pb.Token{Epoch: 2, Seq: 5}}}},
	}
	for i, m := range badResponses {
		if _, err := DecodeMasterMessage(m); !errors.Is(err, ErrBadMessage) {
			t.Errorf("bad master message %d accepted: %v", i, err)
		}
	}
}

// FuzzDecodeSessionRequest: no input panics the decoder or, once decoded,
// the master; whatever decodes re-encodes to an equal message.
func FuzzDecodeSessionRequest(f *testing.F) {
	for _, m := range []any{Hello{Clerk: cA, Epoch: 1, Held: map[string]Mode{"a": Shared}, Tokens: map[string]Token{"a": {1, 1}}, Want: map[string]Mode{}, Recovering: map[ClerkID]Token{}},
		Acquire{"x", Exclusive}, Release{"x", None, Token{1, 1}}, RecoveryDone{cB, true, Token{1, 2}}, RenewRecovery{cB, Token{1, 2}}} {
		b, _ := proto.Marshal(EncodeClerkMessage(m))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		msg, err := DecodeSessionRequest(b)
		if err != nil {
			return
		}
		again, err := DecodeClerkMessage(EncodeClerkMessage(msg))
		if err != nil || !reflect.DeepEqual(again, msg) {
			t.Fatalf("%#v does not round-trip: %#v %v", msg, again, err)
		}
		m := NewMaster(1, []ClerkInfo{{ID: cA, Kind: ""}}, nil)
		if h, ok := msg.(Hello); ok {
			m.Hello(h)
		} else {
			m.Hello(Hello{Clerk: cA, Epoch: 1})
			m.Handle(cA, msg)
		}
	})
}

// FuzzDecodeSessionResponse: the same for what a clerk receives.
func FuzzDecodeSessionResponse(f *testing.F) {
	for _, m := range []any{Welcome{1}, Grant{"x", Shared, Token{1, 1}}, Revoke{"x", None}, Recover{Dead: cB, Names: []string{"x"}, Token: Token{1, 2}}, RecoveryRenewed{Dead: cB, Old: Token{1, 2}, Token: Token{1, 3}}} {
		b, _ := proto.Marshal(EncodeMasterMessage(m))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		msg, err := DecodeSessionResponse(b)
		if err != nil {
			return
		}
		c := NewClerk(cA, "wal")
		c.Connect(1)
		c.Handle(msg)
	})
}

// FuzzDecodeState: the lock namespace (master record, clerk list,
// recovery records) is read from the config service by every candidate
// and clerk; any value under any key is decoded or refused, never a
// panic, and what decodes is a state whose records hold real clerk ids.
func FuzzDecodeState(f *testing.F) {
	enc := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	f.Add("master", enc(&pb.LockMasterRecord{Node: 1, Incarnation: 2, Epoch: 3, GrpcAddr: "127.0.0.1:1"}))
	f.Add("clerk/1-2-3", enc(&pb.LockClerkRecord{Id: &pb.ClerkId{Node: 1, Incarnation: 2, Seq: 3}, Kind: "wal", Scope: []string{"a"}}))
	f.Add("recovery/1-2-3", enc(&pb.LockRecoveryRecord{Dead: &pb.ClerkId{Node: 1, Incarnation: 2, Seq: 3}, Kind: "wal",
		Leases: []*pb.HeldLease{{Name: []byte("a"), Mode: pb.LockMode_LOCK_MODE_SHARED}}, Names: [][]byte{[]byte("b")}}))
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		st, err := DecodeState(&pb.Namespace{Version: 7, Entries: []*pb.Entry{{Key: key, Value: b}}})
		if err != nil {
			return
		}
		for _, c := range st.Clerks {
			if _, err := ClerkIDFromPB(ClerkIDToPB(c.ID)); err != nil {
				t.Fatalf("a clerk record of id %v decoded: %v", c.ID, err)
			}
		}
		for _, r := range st.Records {
			if _, err := ClerkIDFromPB(ClerkIDToPB(r.Dead)); err != nil {
				t.Fatalf("a recovery record of id %v decoded: %v", r.Dead, err)
			}
			for name, m := range r.Held {
				if m != Shared && m != Exclusive {
					t.Fatalf("recovery record holds %q in mode %v", name, m)
				}
			}
		}
	})
}
