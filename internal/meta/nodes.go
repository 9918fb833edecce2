package meta

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

// NodesNamespace is node membership: one pb.Node per node, keyed by its
// decimal id, holding its addresses, roles, disks and current incarnation.
const NodesNamespace = "nodes"

// ErrOldIncarnation means a node tried to register an incarnation not newer
// than the one already registered: it would be confused with a past life.
var ErrOldIncarnation = errors.New("meta: registration with an incarnation not newer than the registered one")

// NodeKey is the membership key of a node.
func NodeKey(id uint64) string { return strconv.FormatUint(id, 10) }

// DecodeNodes returns the membership records of a nodes namespace, in id
// order. A record that does not decode is an error: membership is written
// only by RegisterNode.
func DecodeNodes(ns *pb.Namespace) ([]*pb.Node, error) {
	out := make([]*pb.Node, 0, len(ns.GetEntries()))
	for _, e := range ns.GetEntries() {
		n := &pb.Node{}
		if err := proto.Unmarshal(e.Value, n); err != nil {
			return nil, fmt.Errorf("meta: membership record %q: %w", e.Key, err)
		}
		out = append(out, n)
	}
	// Keys are decimal strings sorted lexically; sort numerically.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Id < out[j-1].Id; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

// RegisterOps computes the decree that records a node's new incarnation
// (with its current addresses and roles) in membership namespace ns, for a
// decree conditional on ns's version. The incarnation must be newer than the
// registered one; an identical record is already registered (a retried
// decree whose first attempt committed) and needs no ops.
func RegisterOps(ns *pb.Namespace, n *pb.Node) ([]*pb.Op, error) {
	if n.Id == 0 || n.Incarnation == 0 {
		return nil, errors.New("meta: node id and incarnation must be non-zero")
	}
	val, err := proto.Marshal(n)
	if err != nil {
		return nil, err
	}
	for _, e := range ns.GetEntries() {
		if e.Key != NodeKey(n.Id) {
			continue
		}
		old := &pb.Node{}
		if err := proto.Unmarshal(e.Value, old); err == nil && old.Incarnation >= n.Incarnation {
			if proto.Equal(old, n) {
				return nil, nil
			}
			return nil, fmt.Errorf("%w: node %d has %d, tried %d", ErrOldIncarnation, n.Id, old.Incarnation, n.Incarnation)
		}
	}
	return []*pb.Op{{Kind: pb.Op_KIND_PUT, Key: NodeKey(n.Id), Value: val}}, nil
}

// RegisterNode records a node's new incarnation with a conditional decree
// (RegisterOps).
func RegisterNode(ctx context.Context, c *Client, n *pb.Node) error {
	_, err := c.Update(ctx, NodesNamespace, "node-"+NodeKey(n.Id), func(ns *pb.Namespace) ([]*pb.Op, error) {
		return RegisterOps(ns, n)
	})
	return err
}

// Registered returns node id's membership record in ns (nil if none).
func Registered(ns *pb.Namespace, id uint64) (*pb.Node, error) {
	for _, e := range ns.GetEntries() {
		if e.Key == NodeKey(id) {
			n := &pb.Node{}
			if err := proto.Unmarshal(e.Value, n); err != nil {
				return nil, fmt.Errorf("meta: membership record %q: %w", e.Key, err)
			}
			return n, nil
		}
	}
	return nil, nil
}
