package meta

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/grovestore/grove/internal/disk"
)

// countedFile is a replica's durable record of the peers whose raft answers
// it has counted (counted).
const countedFile = "counted-peers.json"

// counted is this replica's durable record of the peers whose raft answers
// it has counted: a vote granted to it as a candidate, an append or a
// snapshot acknowledged to it as a leader (or any successful AppendEntries:
// a heartbeat counts too, which only errs on the side of "counted").
//
// Why: a member that has no raft state must not join as a voter if it ever
// had state that counted (a voter that forgot its vote can elect a second
// leader in a term; one that forgot acknowledged entries can help lose a
// committed decree). From its own empty directory a member cannot tell
// "lost my state" from "never had any": a compose cluster whose third
// container started a second late found the other two already running,
// and the late member refused to start for good (CI, TestDockerCompose).
// The other members can tell: every answer that counted passed through one
// of them. A member that every other member of the configuration vouches
// it never counted has no vote or acknowledgement to forget, and may join
// empty; the leader catches it up (node.clusterIsNew).
//
// Durability contract: a peer is written here (fsync of the file and its
// directory) before raft sees the answer that counts it (gatedTransport
// returns the answer only after note), so no count is ever made that a
// crash could leave unrecorded. A write that fails turns the answer into a
// transport error: raft counts nothing. Each peer is written once per
// replica lifetime; the check after that is a map lookup.
//
// Known is false for a replica that had raft state before it kept this
// record (an upgrade): it may have counted anybody, so it vouches for
// nobody. The record goes with the replica's state: a replica that loses
// its directory loses what it counted (see README: "Config-service
// members", the caveat).
type counted struct {
	mu    sync.Mutex
	fs    disk.FS
	path  string
	known bool
	peers map[uint64]bool
	// fences: for each member that asked to be vouched for, when it asked
	// (memory only: a restart forgets them, and a replica that restarted
	// has no RPC from before that still in flight).
	fences map[uint64]time.Time
}

// countedRecord is the file's form.
type countedRecord struct {
	Version int      `json:"version"`
	Known   bool     `json:"known"`
	Peers   []uint64 `json:"peers"`
}

// decodeCounted parses the file, rejecting anything this version did not
// write (the caller refuses to start rather than vouch from a bad record).
func decodeCounted(b []byte) (countedRecord, error) {
	var r countedRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("meta: %s does not decode: %w", countedFile, err)
	}
	if r.Version != 1 {
		return r, fmt.Errorf("meta: %s has version %d, this build reads 1", countedFile, r.Version)
	}
	for _, p := range r.Peers {
		if p == 0 {
			return r, fmt.Errorf("meta: %s lists peer 0", countedFile)
		}
	}
	return r, nil
}

// openCounted reads dir's record, or makes one: knowing (empty) for a
// replica without raft state, unknowing for one that has state but no
// record. A record kept from a replica whose raft state was since removed
// is kept as it is: what it counted was counted.
func openCounted(fs disk.FS, dir string, hasState bool) (*counted, error) {
	c := &counted{fs: fs, path: filepath.Join(dir, countedFile), peers: map[uint64]bool{}, fences: map[uint64]time.Time{}}
	b, err := fs.ReadFile(c.path)
	switch {
	case err == nil:
		r, err := decodeCounted(b)
		if err != nil {
			return nil, err
		}
		c.known = r.Known
		for _, p := range r.Peers {
			c.peers[p] = true
		}
		return c, nil
	case errors.Is(err, os.ErrNotExist):
		c.known = !hasState
		if err := fs.MkdirAll(dir); err != nil {
			return nil, err
		}
		return c, c.writeLocked()
	default:
		return nil, err
	}
}

func (c *counted) writeLocked() error {
	r := countedRecord{Version: 1, Known: c.known, Peers: []uint64{}}
	for p := range c.peers {
		r.Peers = append(r.Peers, p)
	}
	sort.Slice(r.Peers, func(i, j int) bool { return r.Peers[i] < r.Peers[j] })
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return c.fs.WriteFileSync(c.path, b)
}

// note records that id's answer is about to be counted; it returns only
// once that is durable. An id that is not a number (no Grove member's) is
// an error: raft then counts nothing of it. sent, if not zero, is when the
// RPC answered was sent: an answer to an RPC sent before id asked to be
// vouched for is refused (vouch), so none is counted after this replica
// answered that it never counted id.
func (c *counted) note(id raft.ServerID, sent time.Time) error {
	n, err := strconv.ParseUint(string(id), 10, 64)
	if err != nil || n == 0 {
		return fmt.Errorf("meta: raft peer id %q is not a member id", id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peers[n] {
		return nil
	}
	if f, ok := c.fences[n]; ok && !sent.IsZero() && sent.Before(f) {
		return fmt.Errorf("meta: answer of member %d to an RPC sent before it asked to be vouched for: not counted", n)
	}
	c.peers[n] = true
	if err := c.writeLocked(); err != nil {
		// Not recorded: not counted (the caller fails the RPC). It stays
		// in the map only if a later write succeeds; drop it now so the
		// next answer tries again.
		delete(c.peers, n)
		return fmt.Errorf("meta: record peer %d as counted: %w", n, err)
	}
	return nil
}

// list answers the Members probe: whether this replica can vouch, and
// whom it has counted. A non-zero asker is fenced first, under the same
// lock: every answer of its counted before is in the list, and every one
// to an RPC sent before is refused after (note). The sending side takes
// its RPC's time before it sends, so "sent before the fence" covers every
// answer that could still be on its way.
func (c *counted) list(asker uint64) (known bool, peers []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if asker != 0 {
		c.fences[asker] = time.Now()
	}
	for p := range c.peers {
		peers = append(peers, p)
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i] < peers[j] })
	return c.known, peers
}

// AppendEntries, RequestVote and InstallSnapshot record the peer whose
// answer counts before raft sees the answer (counted's contract). The
// pipeline needs no hook: pipelining is off (MaxRPCsInFlight 1, Open), and
// even with it on, hashicorp/raft starts a pipeline to a peer only after a
// plain AppendEntries to it succeeded, which recorded the peer.
func (g *gatedTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	sent := time.Now()
	if err := g.NetworkTransport.AppendEntries(id, target, args, resp); err != nil {
		return err
	}
	if resp.Success {
		return g.count(id, sent)
	}
	return nil
}

func (g *gatedTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	sent := time.Now()
	if err := g.NetworkTransport.RequestVote(id, target, args, resp); err != nil {
		return err
	}
	if resp.Granted {
		return g.count(id, sent)
	}
	return nil
}

func (g *gatedTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	sent := time.Now()
	if err := g.NetworkTransport.InstallSnapshot(id, target, args, resp, data); err != nil {
		return err
	}
	if resp.Success {
		return g.count(id, sent)
	}
	return nil
}

// count notes id; on failure raft sees a failed RPC (it then counts
// nothing: electSelf takes an error for a refused vote, replication for a
// failed append).
func (g *gatedTransport) count(id raft.ServerID, sent time.Time) error {
	if g.counted == nil {
		return nil
	}
	return g.counted.note(id, sent)
}

// has reports whether id is recorded (a peer that is not a member id never
// is).
func (c *counted) has(id raft.ServerID) bool {
	n, err := strconv.ParseUint(string(id), 10, 64)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peers[n]
}

// The receiving side. A replica that grants a vote to a candidate, or
// accepts a leader's append or snapshot, records that peer before its
// answer leaves: the answer is counted by the peer, which thereby relies
// on its own state too (a leader's own log is part of every commit quorum,
// a candidate's own vote part of its election). A leader that lost its
// directory was counted by nobody (it did the counting, and forgot it);
// only its followers and voters can say it ran. Both sides together: every
// exchange that counted is recorded by each replica in it, so a replica
// that lost its state is named by every peer that kept theirs and relied
// on it.

// Consumer hands raft the transport's RPCs, each one from a peer not yet
// recorded with its answer watched (watchAnswer).
func (g *gatedTransport) Consumer() <-chan raft.RPC {
	if g.counted == nil {
		return g.NetworkTransport.Consumer()
	}
	g.once.Do(func() {
		g.consumeCh, g.forwarded = make(chan raft.RPC), make(chan struct{})
		in, done := g.NetworkTransport.Consumer(), g.doneCh()
		go func() {
			defer close(g.forwarded)
			for {
				select {
				case rpc := <-in:
					select {
					case g.consumeCh <- g.watchAnswer(rpc):
					case <-done:
						return
					}
				case <-done:
					return
				}
			}
		}()
	})
	return g.consumeCh
}

// doneCh is closed by Close.
func (g *gatedTransport) doneCh() chan struct{} {
	g.closeOnce.Do(func() { g.done = make(chan struct{}) })
	return g.done
}

// Close stops the forwarding and the watches, then the transport.
func (g *gatedTransport) Close() error {
	done := g.doneCh()
	g.shut.Do(func() { close(done) })
	return g.NetworkTransport.Close()
}

// watchAnswer returns rpc with its answer routed through a check: a
// positive answer (vote granted, append or snapshot accepted) to a peer not
// yet recorded leaves only once the peer is recorded; a record that cannot
// be written turns the answer into an error (the peer counts nothing).
// RPCs from recorded peers, and those that count for nothing (pre-vote,
// TimeoutNow), pass untouched.
func (g *gatedTransport) watchAnswer(rpc raft.RPC) raft.RPC {
	c := g.counted
	if c == nil {
		return rpc
	}
	var id raft.ServerID
	switch r := rpc.Command.(type) {
	case *raft.AppendEntriesRequest:
		id = raft.ServerID(r.RPCHeader.ID)
	case *raft.RequestVoteRequest:
		id = raft.ServerID(r.RPCHeader.ID)
	case *raft.InstallSnapshotRequest:
		id = raft.ServerID(r.RPCHeader.ID)
	default:
		return rpc
	}
	if c.has(id) {
		return rpc
	}
	orig, mine, done := rpc.RespChan, make(chan raft.RPCResponse, 1), g.doneCh()
	rpc.RespChan = mine
	go func() {
		var resp raft.RPCResponse
		select {
		case resp = <-mine:
		case <-done:
			return // the transport is closed: nobody waits for the answer
		}
		if resp.Error == nil && positive(resp.Response) {
			// No fence here: this replica's answer is recorded before it
			// leaves, so no count of it can follow a "never" (list).
			if err := c.note(id, time.Time{}); err != nil {
				resp.Error = err
			}
		}
		orig <- resp // the transport's channel holds one answer: never blocks
	}()
	return rpc
}

// positive reports whether an answer is one the asking peer counts.
func positive(resp interface{}) bool {
	switch r := resp.(type) {
	case *raft.AppendEntriesResponse:
		return r.Success
	case *raft.RequestVoteResponse:
		return r.Granted
	case *raft.InstallSnapshotResponse:
		return r.Success
	}
	return false
}
