package ddstable

import (
	pb "github.com/grovestore/grove/api/grovepb"
)

// Conversions between the cores' types and the gRPC messages
// (api/grovepb/ddstable.proto).

func brickPB(b BrickID) *pb.TableBrick { return &pb.TableBrick{Node: b.Node, Inc: b.Inc} }

func brickOf(b *pb.TableBrick) BrickID { return BrickID{Node: b.GetNode(), Inc: b.GetInc()} }

func partPB(p Partition) *pb.TablePartition {
	return &pb.TablePartition{Bits: p.Bits, Depth: uint32(p.Depth)}
}

// partOf is the partition a message names; ok is false for an invalid one.
func partOf(p *pb.TablePartition) (Partition, bool) {
	if p.GetDepth() > 64 {
		return Partition{}, false
	}
	q := Partition{Bits: p.GetBits(), Depth: uint8(p.GetDepth())}
	return q, q.Valid()
}

func opPB(o OpID) *pb.TableOpID { return &pb.TableOpID{Session: o.Session, Seq: o.Seq} }

func opOf(o *pb.TableOpID) OpID { return OpID{Session: o.GetSession(), Seq: o.GetSeq()} }

func stampPB(s Stamp) *pb.TableStamp { return &pb.TableStamp{Epoch: s.Epoch, Hash: s.Hash} }

func stampOf(s *pb.TableStamp) Stamp { return Stamp{Epoch: s.GetEpoch(), Hash: s.GetHash()} }

func groupPB(g []BrickID) []*pb.TableBrick {
	out := make([]*pb.TableBrick, len(g))
	for i, b := range g {
		out[i] = brickPB(b)
	}
	return out
}

func groupOf(g []*pb.TableBrick) []BrickID {
	out := make([]BrickID, len(g))
	for i, b := range g {
		out[i] = brickOf(b)
	}
	return out
}

// stateOf reads a State off the wire; an unknown value is Absent, which
// no rule takes for an answer.
func stateOf(v uint32) State {
	if v > uint32(Aborted) {
		return Absent
	}
	return State(v)
}

func reasonOf(v uint32) Reason {
	if v > uint32(ReasonNotServing) {
		return ReasonOld
	}
	return Reason(v)
}

// PrepareRequest is the wire form of a coordinator's prepare of table's
// operation (what a library sends a brick).
func PrepareRequest(table string, to BrickID, p *Prepare) *pb.TablePrepareRequest {
	return &pb.TablePrepareRequest{Table: table, To: brickPB(to), Op: opPB(p.Op), Partition: partPB(p.Partition),
		Stamp: stampPB(p.Stamp), Group: groupPB(p.Group), Key: p.Update.Key, Value: p.Update.Value, Remove: p.Update.Remove, Done: p.Done}
}
