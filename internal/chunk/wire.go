package chunk

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
)

// The pairs' records in the config service, the peer messages and the
// client results as they travel (api/grovepb/chunk.proto).

func pairKey(id uint32) string { return fmt.Sprintf("pair/%010d", id) }

// DecodeTable reads the chunk namespace; a record that does not decode or
// breaks an invariant is an error (only this package writes it).
func DecodeTable(ns *pb.Namespace) (*Table, error) {
	t := &Table{Version: ns.GetVersion(), Pairs: map[uint32]*Pair{}}
	for _, e := range ns.GetEntries() {
		if !strings.HasPrefix(e.Key, "pair/") {
			return nil, fmt.Errorf("chunk: unknown key %q", e.Key)
		}
		m := &pb.ChunkPair{}
		if err := proto.Unmarshal(e.Value, m); err != nil {
			return nil, fmt.Errorf("chunk: pair %q: %w", e.Key, err)
		}
		p, err := pairFromPB(m)
		if err != nil {
			return nil, fmt.Errorf("chunk: pair %q: %w", e.Key, err)
		}
		if e.Key != pairKey(p.ID) {
			return nil, fmt.Errorf("chunk: record %q holds pair %d", e.Key, p.ID)
		}
		t.Pairs[p.ID] = p
	}
	return t, nil
}

func pairFromPB(m *pb.ChunkPair) (*Pair, error) {
	if len(m.Nodes) != 2 {
		return nil, fmt.Errorf("%d nodes: want 2", len(m.Nodes))
	}
	p := &Pair{ID: m.Id, Nodes: [2]uint64{m.Nodes[0], m.Nodes[1]}, Primary: int(m.Primary), PrimaryInc: m.PrimaryInc,
		Epoch: m.Epoch, Formatted: m.Formatted, MapRLDev: m.MapRldev, MapBlocks: m.MapBlocks}
	if m.Primary > 1 {
		return nil, fmt.Errorf("primary %d", m.Primary)
	}
	for _, d := range m.Data {
		p.Data = append(p.Data, DataRLDev{ID: d.Id, Blocks: d.Blocks})
	}
	return p, p.Check()
}

// PB returns the pair as stored.
func (p *Pair) PB() *pb.ChunkPair {
	m := &pb.ChunkPair{Id: p.ID, Nodes: []uint64{p.Nodes[0], p.Nodes[1]}, Primary: uint32(p.Primary), PrimaryInc: p.PrimaryInc,
		Epoch: p.Epoch, Formatted: p.Formatted, MapRldev: p.MapRLDev, MapBlocks: p.MapBlocks}
	for _, d := range p.Data {
		m.Data = append(m.Data, &pb.ChunkDataRLDev{Id: d.ID, Blocks: d.Blocks})
	}
	return m
}

// PutOp is the decree op that stores p.
func (p *Pair) PutOp() *pb.Op {
	if err := p.Check(); err != nil {
		panic(err) // programmer error: only checked pairs are proposed
	}
	b, err := proto.Marshal(p.PB())
	if err != nil {
		panic(err)
	}
	return &pb.Op{Kind: pb.Op_KIND_PUT, Key: pairKey(p.ID), Value: b}
}

// ---------------------------------------------------------------- peer messages

func tokenPB(t lock.Token) *pb.ChunkToken { return &pb.ChunkToken{Epoch: uint64(t.Epoch), Seq: t.Seq} }
func tokenOf(t *pb.ChunkToken) lock.Token {
	return lock.Token{Epoch: lock.Epoch(t.GetEpoch()), Seq: t.GetSeq()}
}

// EncodePeer returns msg (Update, Ack or Reload) as it travels.
func EncodePeer(from, inc uint64, msg any) *pb.ChunkServicePeerRequest {
	r := &pb.ChunkServicePeerRequest{FromNode: from, FromInc: inc}
	switch m := msg.(type) {
	case Update:
		u := &pb.ChunkUpdate{Token: tokenPB(m.Token), First: m.First}
		for _, rec := range m.Records {
			x := &pb.ChunkRecord{Kind: uint32(rec.Kind), Id: rec.ID, Rldev: rec.Extent.RLDev,
				Block: rec.Extent.Block, Length: rec.Extent.Len, HighWater: rec.HW}
			if rec.Kind == RecResv {
				x.Rldev, x.Block, x.Length, x.Count = rec.Resv.Run.RLDev, rec.Resv.Run.Block, rec.Resv.Size, rec.Resv.Count
			}
			if rec.Kind == RecAllocOwned || rec.Kind == RecRetire {
				x.OwnerLog, x.OwnerToken = rec.Owner.Log, tokenPB(rec.Owner.Token)
			}
			u.Records = append(u.Records, x)
		}
		r.Cm, r.Msg = m.CM, &pb.ChunkServicePeerRequest_Update{Update: u}
	case Ack:
		r.Cm, r.Msg = m.CM, &pb.ChunkServicePeerRequest_Ack{Ack: &pb.ChunkAck{Code: uint32(m.Code), Inc: m.Inc, Lsn: m.LSN, Token: tokenPB(m.Token)}}
	case Reload:
		r.Cm, r.Msg = m.CM, &pb.ChunkServicePeerRequest_Reload{Reload: &pb.ChunkReload{Token: tokenPB(m.Token)}}
	default:
		panic(fmt.Sprintf("chunk: encoding a peer message %T", msg))
	}
	return r
}

// errBadPeer: a peer message that does not decode.
var errBadPeer = errors.New("chunk: malformed peer message")

// DecodePeer returns the message a peer request carries, checked as the
// log's records are.
func DecodePeer(r *pb.ChunkServicePeerRequest) (any, error) {
	switch m := r.Msg.(type) {
	case *pb.ChunkServicePeerRequest_Update:
		u := Update{CM: r.Cm, Token: tokenOf(m.Update.GetToken()), First: m.Update.GetFirst()}
		if u.First == 0 {
			return nil, fmt.Errorf("%w: an update from LSN 0", errBadPeer)
		}
		for i, x := range m.Update.GetRecords() {
			rec := Record{Kind: byte(x.Kind), ID: x.Id, Extent: Extent{RLDev: x.Rldev, Block: x.Block, Len: x.Length}, HW: x.HighWater}
			ok := false
			switch {
			case x.Kind > 255:
			case rec.Kind == RecAlloc:
				ok = rec.ID != 0 && rec.Extent.RLDev != 0 && rec.Extent.Len != 0 && rec.Extent.Len <= MaxChunk
			case rec.Kind == RecAllocOwned:
				rec.Owner = Owner{Log: x.OwnerLog, Token: tokenOf(x.OwnerToken)}
				ok = rec.ID != 0 && rec.Extent.RLDev != 0 && rec.Extent.Len != 0 && rec.Extent.Len <= MaxChunk && !rec.Owner.IsZero()
			case rec.Kind == RecRetire:
				rec.Extent = Extent{}
				rec.Owner = Owner{Log: x.OwnerLog, Token: tokenOf(x.OwnerToken)}
				ok = !rec.Owner.IsZero()
			case rec.Kind == RecFree, rec.Kind == RecDisown:
				ok = rec.ID != 0
			case rec.Kind == RecReserve:
				ok = true
			case rec.Kind == RecResvClose:
				ok = rec.ID != 0
			case rec.Kind == RecResv:
				rec.Extent = Extent{}
				rec.Resv = Resv{ID: x.Id, Run: Run{RLDev: x.Rldev, Block: x.Block}, Count: x.Count, Size: x.Length}
				if rec.Resv.Count <= MaxReserve && rec.Resv.Size <= MaxChunk {
					rec.Resv.Run.Blocks = rec.Resv.Count * blocksFor(rec.Resv.Size)
				}
				ok = rec.Resv.check() == nil
			}
			if !ok {
				return nil, fmt.Errorf("%w: record %d (%v)", errBadPeer, i, rec)
			}
			u.Records = append(u.Records, rec)
		}
		return u, nil
	case *pb.ChunkServicePeerRequest_Ack:
		if m.Ack.Code > uint32(AckGap) {
			return nil, fmt.Errorf("%w: ack code %d", errBadPeer, m.Ack.Code)
		}
		return Ack{CM: r.Cm, Code: AckCode(m.Ack.Code), Inc: m.Ack.Inc, LSN: m.Ack.Lsn, Token: tokenOf(m.Ack.GetToken())}, nil
	case *pb.ChunkServicePeerRequest_Reload:
		return Reload{CM: r.Cm, Token: tokenOf(m.Reload.GetToken())}, nil
	}
	return nil, fmt.Errorf("%w: no message", errBadPeer)
}

// ---------------------------------------------------------------- results

var resultErrs = []struct {
	code pb.ChunkResult
	err  error
}{
	// First: an error that says the operation may have taken effect
	// says so on the wire whatever else it says.
	{pb.ChunkResult_CHUNK_RESULT_FENCED, ErrFenced},
	{pb.ChunkResult_CHUNK_RESULT_MAYBE_DONE, ErrMaybeDone},
	{pb.ChunkResult_CHUNK_RESULT_BAD_HANDLE, ErrBadHandle},
	{pb.ChunkResult_CHUNK_RESULT_UNALLOCATED, ErrUnallocated},
	{pb.ChunkResult_CHUNK_RESULT_UNKNOWN_MANAGER, ErrUnknownManager},
	{pb.ChunkResult_CHUNK_RESULT_NOT_PRIMARY, ErrNotPrimary},
	{pb.ChunkResult_CHUNK_RESULT_NOT_SERVING, ErrNotServing},
	{pb.ChunkResult_CHUNK_RESULT_OUT_OF_RANGE, ErrOutOfRange},
	{pb.ChunkResult_CHUNK_RESULT_TOO_LARGE, ErrTooLarge},
	{pb.ChunkResult_CHUNK_RESULT_FULL, ErrFull},
	{pb.ChunkResult_CHUNK_RESULT_MAP_FULL, ErrMapFull},
	{pb.ChunkResult_CHUNK_RESULT_BAD_REQUEST, ErrBadRequest},
	{pb.ChunkResult_CHUNK_RESULT_CORRUPT, ErrCorrupt},
	{pb.ChunkResult_CHUNK_RESULT_RETIRED, ErrRetired},
}

// ErrFailed: another failure at the manager (an RLDev's); trying again may
// help.
var ErrFailed = errors.New("chunk: failed")

// resultOf is err as a result code and its text.
func resultOf(err error) (pb.ChunkResult, string) {
	if err == nil {
		return pb.ChunkResult_CHUNK_RESULT_OK, ""
	}
	for _, r := range resultErrs {
		if errors.Is(err, r.err) {
			return r.code, err.Error()
		}
	}
	return pb.ChunkResult_CHUNK_RESULT_FAILED, err.Error()
}

// ResultError is the error a result code and its text stand for
// (errors.Is works with the package's errors).
func ResultError(code pb.ChunkResult, text string) error {
	if code == pb.ChunkResult_CHUNK_RESULT_OK {
		return nil
	}
	base := ErrFailed
	for _, r := range resultErrs {
		if r.code == code {
			base = r.err
		}
	}
	if text == "" || text == base.Error() {
		return base
	}
	return &resultErr{base: base, text: text}
}

type resultErr struct {
	base error
	text string
}

func (e *resultErr) Error() string { return e.text }
func (e *resultErr) Unwrap() error { return e.base }
