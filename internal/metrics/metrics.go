// Package metrics is a node's Prometheus metrics: one registry per node (an
// in-process cluster runs several nodes in one process), the counters and
// gauges the layers update, and the HTTP handler that serves them on the
// node's metrics address. Every method is safe on a nil *Node, so that
// layers and tests without metrics need no special case.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Node holds one node's metrics.
type Node struct {
	reg *prometheus.Registry

	// Failure detector.
	FDSent        *prometheus.CounterVec // kind: beacon, echo
	FDReceived    *prometheus.CounterVec // kind: beacon, echo
	FDDropped     *prometheus.CounterVec // reason
	FDSelfFences  prometheus.Counter
	FDClockBad    prometheus.Counter     // the clock guard's untrusted episodes
	FDVerdicts    *prometheus.CounterVec // answer: dead, alive (per subject), refused (per query)
	FDTombstones  prometheus.Counter     // tombstone files written
	FDIncarnation prometheus.Gauge

	// Config service.
	MetaDecrees  *prometheus.CounterVec // result: ok, duplicate, stale, bad, not_leader, error
	MetaDecreeS  prometheus.Histogram
	MetaWatches  prometheus.Gauge
	MetaRejected *prometheus.CounterVec // why a watch or read was refused

	// Lock service.
	LockGrants      prometheus.Counter
	LockRevocations prometheus.Counter
	LockRecoveries  *prometheus.CounterVec // outcome: started, done, failed
	LockSessions    *prometheus.CounterVec // event: dialed, broken
	LockMalformed   prometheus.Counter

	// B-tree: recovery runs of this node's server that replayed a dead
	// server's log (outcome: done, failed), their durations, and the node
	// writes they made.
	BTreeReplays      *prometheus.CounterVec
	BTreeReplayS      prometheus.Histogram
	BTreeReplayWrites prometheus.Counter

	// Chunk store: requests this node's chunk service answered, by
	// operation and result.
	ChunkRequests *prometheus.CounterVec

	// Garbage: connections and lines dropped on the node's ports, by port
	// (grpc, raft) and reason.
	Garbage *prometheus.CounterVec
}

// New creates the metrics of node id on a registry of their own, with the
// process's Go runtime metrics.
func New(id uint64) *Node {
	reg := prometheus.NewRegistry()
	f := promauto{reg: reg, labels: prometheus.Labels{"node": strconv.FormatUint(id, 10)}}
	m := &Node{reg: reg}
	m.FDSent = f.counterVec("grove_fd_datagrams_sent_total", "Failure-detector datagrams sent, by kind (beacon, echo).", "kind")
	m.FDReceived = f.counterVec("grove_fd_datagrams_accepted_total", "Authenticated failure-detector datagrams accepted, by kind.", "kind")
	m.FDDropped = f.counterVec("grove_fd_datagrams_dropped_total", "Failure-detector datagrams dropped, by reason (malformed, forged, replayed, wrong address, membership moving...).", "reason")
	m.FDSelfFences = f.counter("grove_fd_self_fences_total", "Incarnations of this node that fenced themselves (no majority of observers acknowledged within the grace period).")
	m.FDClockBad = f.counter("grove_fd_clock_untrusted_total", "Times this node's clock guard found its clock's rate off by more than max_drift/2 from the oscillator's, or the host suspended (each gives the running incarnation up; no lease and no verdict for 2 x grace_period).")
	m.FDVerdicts = f.counterVec("grove_fd_answers_total", "Answers this observer gave about node incarnations, by answer.", "answer")
	m.FDTombstones = f.counter("grove_fd_tombstone_writes_total", "Durable writes of this observer's verdict file.")
	m.FDIncarnation = f.gauge("grove_fd_incarnation", "This node's running incarnation (0 while fenced or joining).")
	m.MetaDecrees = f.counterVec("grove_meta_decrees_total", "Decrees proposed to this config-service replica, by result.", "result")
	m.MetaDecreeS = f.histogram("grove_meta_decree_seconds", "Time from proposal to commit and apply of a decree on the leader.")
	m.MetaWatches = f.gauge("grove_meta_watch_streams", "Open watch streams served by this replica.")
	m.MetaRejected = f.counterVec("grove_meta_refused_total", "Reads and watches this replica refused, by reason.", "reason")
	m.LockGrants = f.counter("grove_lock_grants_total", "Leases granted by the lock master on this node.")
	m.LockRevocations = f.counter("grove_lock_revocations_total", "Revocations sent by the lock master on this node.")
	m.LockRecoveries = f.counterVec("grove_lock_recoveries_total", "Recovery runs of this node's clerks, by outcome.", "outcome")
	m.LockSessions = f.counterVec("grove_lock_sessions_total", "Sessions of this node's clerks to the lock master, by event (dialed, broken).", "event")
	m.LockMalformed = f.counter("grove_lock_malformed_messages_total", "Malformed lock-session messages dropped (the session is closed).")
	m.BTreeReplays = f.counterVec("grove_btree_replays_total", "Dead B-tree servers' logs this node's server replayed in recovery runs, by outcome (done, failed).", "outcome")
	m.BTreeReplayS = f.histogram("grove_btree_replay_seconds", "Duration of this node's replays of dead B-tree servers' logs (the dead server's nodes are unavailable meanwhile).")
	m.BTreeReplayWrites = f.counter("grove_btree_replay_writes_total", "Node, link and free records this node's replays applied (one write per node: its newest image).")
	m.ChunkRequests = f.counterVec("grove_chunk_requests_total", "Chunk requests this node answered (allocate, free, disown, retire, reserve, commit, read, write), by result (ok, or the error's kind: not_primary, unallocated, full, fenced...).", "op", "result")
	m.Garbage = f.counterVec("grove_garbage_dropped_total", "Garbage dropped on this node's gRPC and raft ports, by port and reason (failure-detector datagrams are counted in grove_fd_datagrams_dropped_total).", "port", "reason")
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Register adds collectors (for example gauges read at scrape time) to the
// node's registry.
func (m *Node) Register(cs ...prometheus.Collector) {
	if m == nil {
		return
	}
	m.reg.MustRegister(cs...)
}

// GaugeFunc registers a gauge whose value is read at scrape time.
func (m *Node) GaugeFunc(name, help string, labels prometheus.Labels, fn func() float64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, fn))
}

// Handler serves the node's metrics in the Prometheus text format.
func (m *Node) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Timeout: 5 * time.Second})
}

// Gather returns the current values (tests).
func (m *Node) Gather() (map[string]float64, error) {
	fams, err := m.reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			key := f.GetName()
			for _, l := range mt.GetLabel() {
				if l.GetName() != "node" {
					key += "{" + l.GetName() + "=" + l.GetValue() + "}"
				}
			}
			switch {
			case mt.Counter != nil:
				out[key] = mt.Counter.GetValue()
			case mt.Gauge != nil:
				out[key] = mt.Gauge.GetValue()
			case mt.Histogram != nil:
				out[key+"_count"] = float64(mt.Histogram.GetSampleCount())
			}
		}
	}
	return out, nil
}

// BTreeReplay records a replay of a dead B-tree server's log: its outcome,
// duration and the records it applied.
func (m *Node) BTreeReplay(err error, d time.Duration, applied int) {
	if m == nil {
		return
	}
	outcome := "done"
	if err != nil {
		outcome = "failed"
	}
	m.BTreeReplays.WithLabelValues(outcome).Inc()
	m.BTreeReplayS.Observe(d.Seconds())
	m.BTreeReplayWrites.Add(float64(applied))
}

// ChunkRequest counts a chunk request answered.
func (m *Node) ChunkRequest(op, result string) {
	if m != nil {
		m.ChunkRequests.WithLabelValues(op, result).Inc()
	}
}

// CounterFunc registers a counter whose value is read at scrape time.
func (m *Node) CounterFunc(name, help string, labels prometheus.Labels, fn func() float64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, fn))
}

// Decree counts a decree's result on the config-service leader.
func (m *Node) Decree(result string) {
	if m != nil {
		m.MetaDecrees.WithLabelValues(result).Inc()
	}
}

// DecreeLatency records a committed decree's time from proposal to apply.
func (m *Node) DecreeLatency(d time.Duration) {
	if m != nil {
		m.MetaDecreeS.Observe(d.Seconds())
	}
}

// Inc adds one to c; nothing if c is nil (metrics off).
func Inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}

// IncL adds one to v's series for label value l.
func IncL(v *prometheus.CounterVec, l string) {
	if v != nil {
		v.WithLabelValues(l).Inc()
	}
}

// Set sets g.
func Set(g prometheus.Gauge, x float64) {
	if g != nil {
		g.Set(x)
	}
}

// Add adds x to g.
func Add(g prometheus.Gauge, x float64) {
	if g != nil {
		g.Add(x)
	}
}

// Observe records x in h.
func Observe(h prometheus.Histogram, x float64) {
	if h != nil {
		h.Observe(x)
	}
}

type promauto struct {
	reg    *prometheus.Registry
	labels prometheus.Labels
}

func (f promauto) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: f.labels})
	f.reg.MustRegister(c)
	return c
}

func (f promauto) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: f.labels}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f promauto) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: f.labels})
	f.reg.MustRegister(g)
	return g
}

func (f promauto) histogram(name, help string) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: f.labels,
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)})
	f.reg.MustRegister(h)
	return h
}

// Scrape reads the Prometheus text format (a node's /metrics) into
// "name{label=value,...}" → value, leaving out the node label, comments and
// the Go runtime's and process's own series (go_*, process_*), so that
// keys read the same on every node. Tests and the fault suite use it.
func Scrape(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.HasPrefix(line, "go_") || strings.HasPrefix(line, "process_") || strings.HasPrefix(line, "promhttp_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: value in %q: %v", line, err)
		}
		name, labels := line[:i], ""
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name, labels = name[:j], strings.TrimSuffix(name[j+1:], "}")
		}
		var keep []string
		for _, l := range strings.Split(labels, ",") {
			if l != "" && !strings.HasPrefix(l, "node=") {
				keep = append(keep, strings.ReplaceAll(l, `"`, ""))
			}
		}
		if len(keep) > 0 {
			name += "{" + strings.Join(keep, ",") + "}"
		}
		out[name] = v
	}
	return out, sc.Err()
}
