package btree

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/api/etcdpb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
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
// limit and more keys remain, comes from a separate count (atomic up to
// Config.MaxCountLeaves leaves, page by page beyond). A
// DeleteRange over a range deletes key by key (each delete atomic, the
// whole not).
//
// What it does not have: MVCC history (no revisions: a Range at a
// revision, or filtered by revisions, answers Unimplemented; headers and
// key-values carry revision 0 and version 1), leases (a Put with a lease:
// Unimplemented), Txn, Compact, Watch, Lease, Cluster, Maintenance and Auth
// (Unimplemented), sorting by anything but the key.
//
// Routing: every node answers, but by default a node forwards each call to
// the tree's home node (rendezvous hashing of the tree's name over the
// membership), as etcd forwards writes to its leader: one server then
// holds the tree's leases, so concurrent clients share its log's group
// commits and its cache instead of passing node leases from server to
// server (each pass costs a write-back). A call is forwarded only over a
// connection that is up; when the home is unreachable the node serves
// the call itself (any server may: the tree stays coherent through the
// locks), and so it does for a read the home does not answer. A forwarded
// write whose answer is lost answers Unknown.
type EtcdKV struct {
	etcdpb.UnimplementedKVServer
	etcdpb.UnimplementedGroveForwardServer
	svc       *Service
	tree      string
	node      uint64
	book      *meta.AddressBook // nil: no forwarding
	conns     transport.Pool
	forward   bool
	closeOnce sync.Once
	closing   context.Context // ends the forwarding streams
	stop      context.CancelFunc
	mu        sync.Mutex
	links     map[string]*forwardLink // by home address
	// The tree's home and its address, for the membership version whose
	// change channel is homeAt.
	home       uint64
	homeAddrOf string
	homeAt     <-chan struct{}
	// Calls this node forwarded (answered by the home, or lost) and
	// served for other nodes.
	forwardedOut, forwardedIn atomic.Uint64
	// Forwarded calls whose caller gave up: cancellations this node sent,
	// and calls it stopped as the home on such a cancellation.
	cancelSent, forwardCancelled atomic.Uint64
	// workers serve the forwarded calls (the home's).
	workers *workerPool
	// testServeHook, in tests, runs before a forwarded call is served.
	testServeHook atomic.Pointer[func(context.Context)]
}

// CancelStats counts forwarded calls given up by their callers: the
// cancellations this node sent to a home, and the calls it stopped as the
// home.
func (e *EtcdKV) CancelStats() (sent, stopped uint64) {
	return e.cancelSent.Load(), e.forwardCancelled.Load()
}

// ForwardStats are the endpoint's forwarding counts: calls this node
// forwarded to a home node, and calls it served as the home.
func (e *EtcdKV) ForwardStats() (out, in uint64) {
	return e.forwardedOut.Load(), e.forwardedIn.Load()
}

// DefaultEtcdTree is the tree the endpoint serves by default.
const DefaultEtcdTree = "etcd"

// NewEtcdKV returns the endpoint of tree (made at its first use);
// forward sends calls to the tree's home node (see EtcdKV).
func NewEtcdKV(svc *Service, tree string, forward bool) *EtcdKV {
	if tree == "" {
		tree = DefaultEtcdTree
	}
	e := &EtcdKV{svc: svc, tree: tree, node: svc.cfg.Node, forward: forward, links: map[string]*forwardLink{}, workers: newWorkerPool(64, 10*time.Second)}
	e.closing, e.stop = context.WithCancel(context.Background())
	if forward && svc.cfg.Meta != nil {
		e.book = meta.NewAddressBook(svc.cfg.Meta)
	}
	return e
}

// Close stops the endpoint's membership watch and connections (once).
func (e *EtcdKV) Close() {
	e.closeOnce.Do(func() {
		if e.book != nil {
			e.book.Close()
		}
		e.stop()
		e.mu.Lock()
		for _, l := range e.links {
			l.closeLink()
		}
		e.mu.Unlock()
		e.conns.Close()
	})
}

// forwardedKey marks a forwarded call (metadata): it is served where it
// lands, never forwarded again.
const forwardedKey = "grove-etcd-forwarded"

// isForwarded: ctx is a forwarded call's (served where it landed).
func isForwarded(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(forwardedKey)) > 0
}

// forwardedStartWait is how long a forwarded call waits at the home for
// the home's starting B-tree server (making or recovering its log after a
// restart, which can take seconds). Past it the home answers NOT_APPLIED,
// Unavailable, and the node that forwarded the call serves it itself
// (servableHere) instead of holding its caller for the start.
const forwardedStartWait = 200 * time.Millisecond

// servableHere: the home refused a forwarded call before any change, as
// unable to serve it now (its server starting or stopping, its node
// leaving); this node may serve the call itself, while its caller waits.
func servableHere(ctx context.Context, err error) bool {
	st := status.Convert(err)
	return ctx.Err() == nil && st.Code() == codes.Unavailable && IsNotApplied(st)
}

// Home is the home node of tree among nodes: rendezvous hashing, so that a
// node joining or leaving moves only the trees whose home it is or
// becomes.
func Home(tree string, nodes []uint64) uint64 {
	var best, bestH uint64
	for _, id := range nodes {
		h := fnv.New64a()
		h.Write([]byte(tree))
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], id)
		h.Write(b[:])
		if x := h.Sum64(); best == 0 || x > bestH || x == bestH && id < best {
			best, bestH = id, x
		}
	}
	return best
}

// peer returns the link to the home if the call should go there: the home
// is another node, the call was not forwarded already, and the connection
// to the home is up (nothing is sent otherwise: the caller serves it).
func (e *EtcdKV) peer(ctx context.Context) (*forwardLink, bool) {
	if e.book == nil {
		return nil, false
	}
	if isForwarded(ctx) {
		return nil, false
	}
	home, addr := e.homeAddr()
	if home == 0 || home == e.node {
		return nil, false
	}
	cc, err := e.conns.Get(addr)
	if err != nil {
		return nil, false
	}
	if cc.GetState() != connectivity.Ready {
		cc.Connect() // for the next call
		return nil, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.links[addr]
	if l == nil || l.cc != cc {
		l = &forwardLink{cc: cc, close: e.closing, sent: &e.forwardedOut, cancelled: &e.cancelSent}
		e.links[addr] = l
		for a, old := range e.links { // one tree, one home: a former home's stream goes
			if a != addr {
				old.closeLink()
				delete(e.links, a)
			}
		}
	}
	return l, true
}

// homeAddr is the tree's home node and its address, computed once per
// version of the membership.
func (e *EtcdKV) homeAddr() (uint64, string) {
	nodes, changed := e.book.View()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.homeAt != changed {
		ids := make([]uint64, 0, len(nodes))
		for id := range nodes {
			ids = append(ids, id)
		}
		e.home = Home(e.tree, ids)
		e.homeAt, e.homeAddrOf = changed, nodes[e.home]
	}
	return e.home, e.homeAddrOf
}

func uintString(v uint64) string { return strconv.FormatUint(v, 10) }

// forwarded maps a forwarded call's failure: an answer from the home passes
// through; a lost one is Unknown for a write (it may have been applied)
// and Unavailable for a read.
func forwarded(err error, write bool) error {
	st, _ := status.FromError(err)
	if st.Code() == codes.Unavailable && !IsNotApplied(st) && write {
		return status.Errorf(codes.Unknown, "grove etcd endpoint: the tree's home node did not answer (the write may have been applied): %v", st.Message())
	}
	return err
}

// clusterID identifies "the cluster" in etcd headers (a constant: Grove's
// cluster identity is its key, which is not for clients).
const clusterID = 0x67726f7665 // "grove"

func (e *EtcdKV) header() *etcdpb.ResponseHeader {
	return &etcdpb.ResponseHeader{ClusterId: clusterID, MemberId: e.node}
}

// open finds the tree, making it the first time.
func (e *EtcdKV) open(ctx context.Context) (*Server, *Tree, error) {
	wait := ctx
	if isForwarded(ctx) {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, forwardedStartWait)
		defer cancel()
	}
	srv, err := e.svc.Server(wait)
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

// againIfDropped runs f, a call's part on this node, once more if it found
// the endpoint's tree dropped: NotFound here is ErrNoTree alone, found
// before any change (a range delete that deleted keys answers Unknown
// instead), and done forgot the tree, so open makes it again, as at the
// endpoint's first use (review 55: a call after a drop of the endpoint's
// tree answered NotFound, which etcd never answers).
func againIfDropped[T any](f func() (T, error)) (T, error) {
	v, err := f()
	if status.Code(err) == codes.NotFound {
		v, err = f()
	}
	return v, err
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

// etcdAnswerMax bounds what one Range (or DeleteRange with prev_kv)
// gathers into its answer: one message (review 55: an unlimited range was
// read whole into memory, then refused by gRPC's send limit).
const etcdAnswerMax = forwardAnswerMax

// kvSize is an entry's share of an answer (its bytes and the encoding's).
func kvSize(k, v []byte) int { return len(k) + len(v) + 16 }

// errEtcdAnswerTooLarge refuses a range whose answer would pass
// etcdAnswerMax, before it is read whole.
func errEtcdAnswerTooLarge(what string) error {
	return status.Errorf(codes.ResourceExhausted, "grove etcd endpoint: %s would pass %d MiB (one message); use a limit (etcdctl --limit), --keys-only, or a smaller range", what, etcdAnswerMax>>20)
}

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
	if l, ok := e.peer(ctx); ok {
		ans, err := l.call(ctx, e.node, &etcdpb.ForwardCall{Op: &etcdpb.ForwardCall_Range{Range: r}})
		switch {
		case err == nil && ans.GetRange() != nil:
			return ans.GetRange(), nil
		case err == nil:
			return nil, status.Error(codes.Internal, "etcd endpoint: the home node answered a range with something else")
		case errors.Is(err, errNotSent):
		case status.Code(err) != codes.Unavailable || ctx.Err() != nil:
			return nil, forwarded(err, false)
		}
		// Not sent, the home did not answer, or it refused the call
		// before any change (its server starting): served here.
	}
	return againIfDropped(func() (*etcdpb.RangeResponse, error) { return e.rangeHere(ctx, r, er) })
}

// rangeHere serves r on this node.
func (e *EtcdKV) rangeHere(ctx context.Context, r *etcdpb.RangeRequest, er etcdRange) (*etcdpb.RangeResponse, error) {
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
		n, err := countRange(ctx, t, sp)
		if err != nil {
			return nil, done(srv, e.tree, err)
		}
		out.Count = int64(n)
		return out, nil
	}
	reverse := r.SortOrder == etcdpb.RangeRequest_DESCEND
	limit := int(r.Limit)
	size := 0
	for {
		left := 0
		if limit > 0 {
			left = limit + 1 - len(out.Kvs) // one more tells whether there are more
		}
		scan := t.Scan
		if r.KeysOnly {
			scan = t.ScanKeys
		}
		pg, err := scan(ctx, sp, left, reverse)
		if err != nil {
			return nil, done(srv, e.tree, err)
		}
		for i, k := range pg.Keys {
			var v []byte
			if !r.KeysOnly {
				v = pg.Vals[i]
			}
			if size += kvSize(k, v); size > etcdAnswerMax {
				return nil, errEtcdAnswerTooLarge("the range's answer")
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
		n, err := countRange(ctx, t, er.Span)
		if err != nil {
			return nil, done(srv, e.tree, err)
		}
		out.Count = max(int64(n), int64(len(out.Kvs)))
	}
	return out, nil
}

// countRange counts sp's keys: atomically (Tree.Count) when the range spans
// at most MaxCountLeaves leaves, else page by page (each page atomic, the
// sum not; etcd's count is one snapshot).
func countRange(ctx context.Context, t *Tree, sp Span) (int, error) {
	n, err := t.Count(ctx, sp)
	if !errors.Is(err, ErrRangeTooLarge) {
		return n, err
	}
	n = 0
	for {
		pg, err := t.ScanKeys(ctx, sp, 0, false)
		if err != nil {
			return 0, err
		}
		n += len(pg.Keys)
		if !pg.More {
			return n, nil
		}
		sp.From = pg.Hi
	}
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
	if l, ok := e.peer(ctx); ok {
		ans, err := l.call(ctx, e.node, &etcdpb.ForwardCall{Op: &etcdpb.ForwardCall_Put{Put: r}})
		if err == nil && ans.GetPut() != nil {
			return ans.GetPut(), nil
		}
		if err == nil {
			return nil, status.Error(codes.Unknown, "etcd endpoint: the home node answered with something else")
		}
		if !errors.Is(err, errNotSent) && !servableHere(ctx, err) {
			return nil, forwarded(err, true)
		}
	}
	return againIfDropped(func() (*etcdpb.PutResponse, error) { return e.putHere(ctx, r) })
}

// putHere serves r on this node.
func (e *EtcdKV) putHere(ctx context.Context, r *etcdpb.PutRequest) (*etcdpb.PutResponse, error) {
	srv, t, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := srv.OpContext(ctx)
	defer cancel()
	res, err := t.Put(ctx, r.Key, r.Value, Cond{Prev: r.PrevKv})
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
	if l, ok := e.peer(ctx); ok {
		ans, err := l.call(ctx, e.node, &etcdpb.ForwardCall{Op: &etcdpb.ForwardCall_DeleteRange{DeleteRange: r}})
		if err == nil && ans.GetDeleteRange() != nil {
			return ans.GetDeleteRange(), nil
		}
		if err == nil {
			return nil, status.Error(codes.Unknown, "etcd endpoint: the home node answered with something else")
		}
		if !errors.Is(err, errNotSent) && !servableHere(ctx, err) {
			return nil, forwarded(err, true)
		}
	}
	return againIfDropped(func() (*etcdpb.DeleteRangeResponse, error) { return e.deleteRangeHere(ctx, r, er) })
}

// deleteRangeHere serves r on this node.
func (e *EtcdKV) deleteRangeHere(ctx context.Context, r *etcdpb.DeleteRangeRequest, er etcdRange) (*etcdpb.DeleteRangeResponse, error) {
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
	prevSize := 0
	del := func(k []byte) error {
		res, err := t.Delete(ctx, k, Cond{Prev: r.PrevKv})
		if err != nil {
			return done(srv, e.tree, err)
		}
		if res.Found {
			out.Deleted++
			if r.PrevKv {
				out.PrevKvs = append(out.PrevKvs, kv(k, res.Prev))
				if prevSize += kvSize(k, res.Prev); prevSize > etcdAnswerMax {
					// The answer could not be sent: stop here. The keys
					// deleted so far stay deleted (a range is deleted
					// key by key): partial says how many.
					return errEtcdAnswerTooLarge("the previous values of the deleted keys")
				}
			}
		}
		return nil
	}
	if er.single {
		return out, del(sp.From)
	}
	// A range is deleted key by key: once one is gone, a failure is no
	// longer "not applied" (nor Unavailable, which a client may take so).
	partial := func(err error) error {
		if out.Deleted == 0 {
			return err
		}
		return status.Errorf(codes.Unknown, "grove etcd endpoint: the range's delete stopped after deleting %d keys: %s", out.Deleted, status.Convert(err).Message())
	}
	for {
		pg, err := t.ScanKeys(ctx, sp, 0, false)
		if err != nil {
			return nil, partial(done(srv, e.tree, err))
		}
		for _, k := range pg.Keys {
			if err := del(k); err != nil {
				return nil, partial(err)
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
