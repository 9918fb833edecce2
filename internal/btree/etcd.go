package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/api/etcdpb"
)

// EtcdKV is the etcd-compatible endpoint: etcd v3's KV service (the part
// etcdctl get/put/del and etcd's benchmark tool use) on one tree, served by
// every node on its gRPC address.
//
// What it keeps of etcd's semantics: a Put, a single-key Range and a
// single-key DeleteRange are atomic, linearizable and durable once answered
// (the tree's own guarantees; every Range is linearizable, serializable
// or not). A Range over many keys is read a page at a time (a page is
// atomic: up to Config.MaxScanLeaves leaves); its count, when it has a
// limit and more keys remain, comes from a separate atomic count. A
// DeleteRange over a range deletes key by key (each delete atomic, the
// whole not).
//
// What it does not have: MVCC history (no revisions: a Range at a
// revision, or filtered by revisions, answers Unimplemented; headers and
// key-values carry revision 0 and version 1), leases (a Put with a lease:
// Unimplemented), Txn, Compact, Watch, Lease, Cluster, Maintenance and Auth
// (Unimplemented), sorting by anything but the key.
type EtcdKV struct {
	etcdpb.UnimplementedKVServer
	svc  *Service
	tree string
	node uint64
}

// DefaultEtcdTree is the tree the endpoint serves by default.
const DefaultEtcdTree = "etcd"

// NewEtcdKV returns the endpoint of tree (made at its first use).
func NewEtcdKV(svc *Service, tree string) *EtcdKV {
	if tree == "" {
		tree = DefaultEtcdTree
	}
	return &EtcdKV{svc: svc, tree: tree, node: svc.cfg.Node}
}

// clusterID identifies "the cluster" in etcd headers (a constant: Grove's
// cluster identity is its key, which is not for clients).
const clusterID = 0x67726f7665 // "grove"

func (e *EtcdKV) header() *etcdpb.ResponseHeader {
	return &etcdpb.ResponseHeader{ClusterId: clusterID, MemberId: e.node}
}

// open finds the tree, making it the first time.
func (e *EtcdKV) open(ctx context.Context) (*Server, *Tree, error) {
	srv, err := e.svc.Server(ctx)
	if err != nil {
		return nil, nil, err
	}
	t, err := srv.Open(ctx, e.tree)
	if errors.Is(err, ErrNoTree) {
		if _, err = srv.CreateTree(ctx, e.tree, Config{}); err != nil && !errors.Is(err, ErrTreeExists) {
			return nil, nil, notApplied(codes.Unavailable, fmt.Sprintf("etcd endpoint: making tree %q: %v", e.tree, err))
		}
		t, err = srv.Open(ctx, e.tree)
	}
	if err != nil {
		return nil, nil, notApplied(codes.Unavailable, err.Error())
	}
	return srv, t, nil
}

// etcd's own error texts for the checks it makes.
var (
	errEtcdEmptyKey = status.Error(codes.InvalidArgument, "etcdserver: key is not provided")
	errEtcdNoMVCC   = status.Error(codes.Unimplemented, "grove etcd endpoint: no MVCC history (revisions are not kept: read the latest value without --rev and revision filters)")
)

// etcdRange is etcd's [key, range_end) as the tree's span: an empty
// range_end is the key alone, "\x00" means no end, and a key of "\x00"
// with it means every key.
type etcdRange struct {
	Span
	single bool // just Span.From
	empty  bool // range_end <= key: nothing
}

func etcdSpan(key, end []byte) (etcdRange, error) {
	if len(key) == 0 {
		return etcdRange{}, errEtcdEmptyKey
	}
	if len(key) > MaxKey || len(end) > MaxKey {
		return etcdRange{}, rpcError(ErrKey)
	}
	switch {
	case len(end) == 0:
		return etcdRange{Span: Span{From: key}, single: true}, nil
	case bytes.Equal(end, []byte{0}):
		if bytes.Equal(key, []byte{0}) {
			key = nil
		}
		return etcdRange{Span: Span{From: key}}, nil
	case bytes.Compare(key, end) >= 0:
		return etcdRange{empty: true}, nil
	}
	return etcdRange{Span: Span{From: key, To: end}}, nil
}

func kv(k, v []byte) *etcdpb.KeyValue { return &etcdpb.KeyValue{Key: k, Value: v, Version: 1} }

func (e *EtcdKV) Range(ctx context.Context, r *etcdpb.RangeRequest) (*etcdpb.RangeResponse, error) {
	if r.Revision != 0 || r.MinModRevision != 0 || r.MaxModRevision != 0 || r.MinCreateRevision != 0 || r.MaxCreateRevision != 0 {
		return nil, errEtcdNoMVCC
	}
	if r.SortTarget != etcdpb.RangeRequest_KEY && r.SortOrder != etcdpb.RangeRequest_NONE {
		return nil, status.Errorf(codes.Unimplemented, "grove etcd endpoint: sorting by %v (only by key)", r.SortTarget)
	}
	if r.Limit < 0 {
		return nil, status.Error(codes.InvalidArgument, "etcdserver: negative limit")
	}
	er, err := etcdSpan(r.Key, r.RangeEnd)
	if err != nil {
		return nil, err
	}
	out := &etcdpb.RangeResponse{Header: e.header()}
	if er.empty {
		return out, nil
	}
	srv, t, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := srv.OpContext(ctx)
	defer cancel()
	sp := er.Span
	if er.single {
		v, ok, err := t.Get(ctx, sp.From)
		if err != nil {
			return nil, done(srv, e.tree, err)
		}
		if ok {
			out.Count = 1
			if !r.CountOnly {
				if r.KeysOnly {
					v = nil
				}
				out.Kvs = []*etcdpb.KeyValue{kv(sp.From, v)}
			}
		}
		return out, nil
	}
	if r.CountOnly {
		n, err := t.Count(ctx, sp)
		if err != nil {
			return nil, done(srv, e.tree, err)
		}
		out.Count = int64(n)
		return out, nil
	}
	reverse := r.SortOrder == etcdpb.RangeRequest_DESCEND
	limit := int(r.Limit)
	for {
		left := 0
		if limit > 0 {
			left = limit + 1 - len(out.Kvs) // one more tells whether there are more
		}
		pg, err := t.Scan(ctx, sp, left, reverse)
		if err != nil {
			return nil, done(srv, e.tree, err)
		}
		for i, k := range pg.Keys {
			var v []byte
			if !r.KeysOnly {
				v = pg.Vals[i]
			}
			out.Kvs = append(out.Kvs, kv(k, v))
		}
		if limit > 0 && len(out.Kvs) > limit {
			out.Kvs, out.More = out.Kvs[:limit], true
			break
		}
		if !pg.More {
			break
		}
		if reverse {
			sp.To = pg.Lo
			if sp.To == nil {
				sp.To = []byte{}
			}
		} else {
			sp.From = pg.Hi
		}
	}
	out.Count = int64(len(out.Kvs))
	if out.More {
		// etcd counts the whole range; ours is a second atomic step.
		n, err := t.Count(ctx, er.Span)
		if err != nil {
			return nil, done(srv, e.tree, err)
		}
		out.Count = max(int64(n), int64(len(out.Kvs)))
	}
	return out, nil
}

func (e *EtcdKV) Put(ctx context.Context, r *etcdpb.PutRequest) (*etcdpb.PutResponse, error) {
	if len(r.Key) == 0 {
		return nil, errEtcdEmptyKey
	}
	if r.Lease != 0 || r.IgnoreLease {
		return nil, status.Error(codes.Unimplemented, "grove etcd endpoint: no leases (keys do not expire)")
	}
	if r.IgnoreValue {
		return nil, status.Error(codes.Unimplemented, "grove etcd endpoint: ignore_value is not supported")
	}
	srv, t, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := srv.OpContext(ctx)
	defer cancel()
	res, err := t.Put(ctx, r.Key, r.Value, Cond{})
	if err != nil {
		return nil, done(srv, e.tree, err)
	}
	out := &etcdpb.PutResponse{Header: e.header()}
	if r.PrevKv && res.Found {
		out.PrevKv = kv(r.Key, res.Prev)
	}
	return out, nil
}

func (e *EtcdKV) DeleteRange(ctx context.Context, r *etcdpb.DeleteRangeRequest) (*etcdpb.DeleteRangeResponse, error) {
	er, err := etcdSpan(r.Key, r.RangeEnd)
	if err != nil {
		return nil, err
	}
	out := &etcdpb.DeleteRangeResponse{Header: e.header()}
	if er.empty {
		return out, nil
	}
	srv, t, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := srv.OpContext(ctx)
	defer cancel()
	sp := er.Span
	del := func(k []byte) error {
		res, err := t.Delete(ctx, k, Cond{})
		if err != nil {
			return done(srv, e.tree, err)
		}
		if res.Found {
			out.Deleted++
			if r.PrevKv {
				out.PrevKvs = append(out.PrevKvs, kv(k, res.Prev))
			}
		}
		return nil
	}
	if er.single {
		return out, del(sp.From)
	}
	for {
		pg, err := t.Scan(ctx, sp, 0, false)
		if err != nil {
			return nil, done(srv, e.tree, err)
		}
		for _, k := range pg.Keys {
			if err := del(k); err != nil {
				return nil, err
			}
		}
		if !pg.More {
			return out, nil
		}
		sp.From = pg.Hi
	}
}

func (e *EtcdKV) Txn(context.Context, *etcdpb.TxnRequest) (*etcdpb.TxnResponse, error) {
	return nil, status.Error(codes.Unimplemented, "grove etcd endpoint: no transactions (Txn); use grove's conditional put and delete")
}

func (e *EtcdKV) Compact(context.Context, *etcdpb.CompactionRequest) (*etcdpb.CompactionResponse, error) {
	return nil, status.Error(codes.Unimplemented, "grove etcd endpoint: no MVCC history to compact")
}
