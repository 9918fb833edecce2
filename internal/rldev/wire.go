package rldev

import (
	"errors"
	"fmt"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
)

// The wire forms of the peer messages (api/grovepb/rldev.proto) and of the
// client results. Decoding checks every length and count a message's
// receiver relies on, so that a malformed frame is refused here with an
// error, never handed to the engine.

// MaxPullBlocks bounds a pull (the engine refuses more).
const MaxPullBlocks = 4096

// ErrBadMessage wraps every decoding error.
var ErrBadMessage = errors.New("rldev: malformed message")

func badMsg(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadMessage, fmt.Sprintf(format, args...))
}

// EncodePeer returns msg (one of the engine's peer messages) as a frame.
func EncodePeer(msg any) *pb.RLDevServicePeerRequest {
	switch m := msg.(type) {
	case Forward:
		return &pb.RLDevServicePeerRequest{Msg: &pb.RLDevServicePeerRequest_Forward{Forward: &pb.RLDevForward{
			Rldev: m.RLDev, Epoch: m.Epoch, Seq: m.Seq, Block: m.Block, Gen: m.Gen, Data: m.Data, Fence: fenceToPB(m.Fence), Target: m.Target,
			Writer: m.WID.Writer, WriteSeq: m.WID.Seq}}}
	case Ack:
		return &pb.RLDevServicePeerRequest{Msg: &pb.RLDevServicePeerRequest_Ack{Ack: &pb.RLDevAck{
			Rldev: m.RLDev, Seq: m.Seq, Code: uint32(m.Code), Epoch: m.Epoch}}}
	case Pull:
		return &pb.RLDevServicePeerRequest{Msg: &pb.RLDevServicePeerRequest_Pull{Pull: &pb.RLDevPull{
			Rldev: m.RLDev, Epoch: m.Epoch, Seq: m.Seq, Block: m.Block, Count: m.Count, GensOnly: m.GensOnly, Owed: m.Owed}}}
	case PullData:
		return &pb.RLDevServicePeerRequest{Msg: &pb.RLDevServicePeerRequest_PullData{PullData: &pb.RLDevPullData{
			Rldev: m.RLDev, Seq: m.Seq, Code: uint32(m.Code), Data: m.Data, Gens: m.Gens, Bad: m.Bad,
			GensOnly: m.Data == nil && m.Gens != nil}}}
	case ResyncMe:
		return &pb.RLDevServicePeerRequest{Msg: &pb.RLDevServicePeerRequest_ResyncMe{ResyncMe: &pb.RLDevResyncMe{
			Rldev: m.RLDev, Epoch: m.Epoch, Dirty: m.Dirty, Blank: m.Blank}}}
	case Copy:
		var toks []*pb.RLDevFence
		for i := range m.Tokens {
			toks = append(toks, fenceToPB(&m.Tokens[i]))
		}
		return &pb.RLDevServicePeerRequest{Msg: &pb.RLDevServicePeerRequest_Copy{Copy: &pb.RLDevCopy{
			Rldev: m.RLDev, Epoch: m.Epoch, Seq: m.Seq, Block: m.Block, Data: m.Data, Gens: m.Gens, Tokens: toks, Target: m.Target}}}
	}
	panic(fmt.Sprintf("rldev: EncodePeer(%T)", msg)) // programmer error: the engine sends only these
}

// DecodePeer returns the engine message a frame carries (a hello is the
// link's business, not the engine's: it is refused here).
func DecodePeer(f *pb.RLDevServicePeerRequest) (any, error) {
	if f == nil {
		return nil, badMsg("empty frame")
	}
	switch x := f.Msg.(type) {
	case *pb.RLDevServicePeerRequest_Forward:
		m := x.Forward
		if m == nil || len(m.Data) == 0 || len(m.Data)%BlockSize != 0 {
			return nil, badMsg("forward: %d bytes of data, want whole blocks", lenData(m))
		}
		f, err := fenceFromPB(m.Fence)
		if err != nil {
			return nil, err
		}
		return Forward{RLDev: m.Rldev, Epoch: m.Epoch, Seq: m.Seq, Block: m.Block, Gen: m.Gen, Data: m.Data, Fence: f, Target: m.Target,
			WID: WriteID{Writer: m.Writer, Seq: m.WriteSeq}}, nil
	case *pb.RLDevServicePeerRequest_Ack:
		m := x.Ack
		if m == nil || Code(m.Code) > lastCode {
			return nil, badMsg("ack: bad code")
		}
		return Ack{RLDev: m.Rldev, Seq: m.Seq, Code: Code(m.Code), Epoch: m.Epoch}, nil
	case *pb.RLDevServicePeerRequest_Pull:
		m := x.Pull
		if m == nil || m.Count == 0 || m.Count > MaxPullBlocks {
			return nil, badMsg("pull: bad count")
		}
		return Pull{RLDev: m.Rldev, Epoch: m.Epoch, Seq: m.Seq, Block: m.Block, Count: m.Count, GensOnly: m.GensOnly, Owed: m.Owed}, nil
	case *pb.RLDevServicePeerRequest_PullData:
		m := x.PullData
		if m == nil || Code(m.Code) > lastCode {
			return nil, badMsg("pull data: bad code")
		}
		pd := PullData{RLDev: m.Rldev, Seq: m.Seq, Code: Code(m.Code), Bad: m.Bad}
		switch {
		case len(m.Gens) > MaxPullBlocks || len(m.Bad) > len(m.Gens):
			return nil, badMsg("pull data: %d generations, %d bad blocks", len(m.Gens), len(m.Bad))
		case m.GensOnly:
			if len(m.Data) != 0 || len(m.Gens) == 0 {
				return nil, badMsg("pull data: generations only, with %d bytes and %d generations", len(m.Data), len(m.Gens))
			}
			pd.Gens = m.Gens
		case len(m.Data) != len(m.Gens)*BlockSize:
			return nil, badMsg("pull data: %d bytes for %d generations", len(m.Data), len(m.Gens))
		case len(m.Gens) > 0:
			pd.Data, pd.Gens = m.Data, m.Gens
		}
		return pd, nil
	case *pb.RLDevServicePeerRequest_ResyncMe:
		m := x.ResyncMe
		if m == nil {
			return nil, badMsg("empty resync request")
		}
		return ResyncMe{RLDev: m.Rldev, Epoch: m.Epoch, Dirty: m.Dirty, Blank: m.Blank}, nil
	case *pb.RLDevServicePeerRequest_Copy:
		m := x.Copy
		if m == nil || len(m.Gens) == 0 || len(m.Gens) > MaxPullBlocks || len(m.Data) != len(m.Gens)*BlockSize {
			return nil, badMsg("copy: %d bytes for %d generations", lenData(m), lenGens(m))
		}
		if len(m.Tokens) > MaxTokenNames {
			return nil, badMsg("copy: %d fencing tokens", len(m.Tokens))
		}
		var toks []Fence
		for _, t := range m.Tokens {
			f, err := fenceFromPB(t)
			if err != nil || f == nil {
				return nil, badMsg("copy: a bad fencing token")
			}
			toks = append(toks, *f)
		}
		return Copy{RLDev: m.Rldev, Epoch: m.Epoch, Seq: m.Seq, Block: m.Block, Data: m.Data, Gens: m.Gens, Tokens: toks, Target: m.Target}, nil
	case *pb.RLDevServicePeerRequest_Hello:
		return nil, badMsg("a hello after the first frame")
	}
	return nil, badMsg("unknown frame")
}

func lenData(m interface{ GetData() []byte }) int {
	if m == nil {
		return 0
	}
	return len(m.GetData())
}

func lenGens(m *pb.RLDevCopy) int {
	if m == nil {
		return 0
	}
	return len(m.Gens)
}

func fenceToPB(f *Fence) *pb.RLDevFence {
	if f == nil {
		return nil
	}
	return &pb.RLDevFence{Name: f.Name, Epoch: uint64(f.Token.Epoch), Seq: f.Token.Seq}
}

// FenceFromPB returns a write's fence (nil without one).
func fenceFromPB(f *pb.RLDevFence) (*Fence, error) {
	if f == nil {
		return nil, nil
	}
	if f.Name == "" || len(f.Name) > 1024 {
		return nil, badMsg("fence: a lock name of %d bytes", len(f.Name))
	}
	return &Fence{Name: f.Name, Token: lock.Token{Epoch: lock.Epoch(f.Epoch), Seq: f.Seq}}, nil
}

// ResultOf is a request's outcome as a client sees it; inc is the engine
// incarnation that answered (0: none).
func ResultOf(err error, epoch, inc uint64) *pb.RLDevResult {
	if err == nil {
		return &pb.RLDevResult{Epoch: epoch, Incarnation: inc}
	}
	return &pb.RLDevResult{Code: uint32(CodeOf(err)), Error: err.Error(), MaybeWritten: errors.Is(err, ErrMaybeWritten), Epoch: epoch, Incarnation: inc}
}

// ResultError is the error a result carries (nil for OK): it wraps the
// code's sentinel, and ErrMaybeWritten if the result says so.
func ResultError(r *pb.RLDevResult) error {
	if r == nil {
		return badMsg("a reply without a result")
	}
	c := Code(r.Code)
	if c == OK {
		return nil
	}
	if c > lastCode {
		c = BadRequest
	}
	e := &resultError{code: c, msg: r.Error, maybe: r.MaybeWritten}
	if e.msg == "" {
		e.msg = c.Err().Error()
	}
	return e
}

// resultError is a remote replica's error: its message as the replica
// wrote it, and errors.Is against the sentinels it stands for.
type resultError struct {
	code  Code
	msg   string
	maybe bool
}

func (e *resultError) Error() string { return e.msg }

func (e *resultError) Is(target error) bool {
	return target == e.code.Err() || e.maybe && target == ErrMaybeWritten
}
