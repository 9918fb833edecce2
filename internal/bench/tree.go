package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/grovestore/grove/api/etcdpb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/meta"
)

// TreeOptions shape the B-link tree benchmark (Boxwood §4.4, Figures 6-7).
type TreeOptions struct {
	Clients []int // client counts (Boxwood: 1 to 8 machines)
	Ops     int   // keys each client inserts, looks up and deletes
	Rounds  int
	// Shapes: "paper" (10-byte keys and values, fanout 6, Boxwood's), "big"
	// (16-byte keys, 256-byte values, the default node size), "large"
	// (16-byte keys, 64 KiB values: values in chunks of their own).
	Shapes []string
	// Etcd adds the etcd comparison: a 3-member etcd cluster on this
	// machine, and Grove through its etcd-compatible endpoint, driven by
	// the same etcd v3 gRPC load (puts, then linearizable single-key
	// ranges) at every client count, for every shape.
	Etcd bool
	// NoFigures leaves Figures 6 and 7 out (the etcd comparison alone).
	NoFigures bool
}

// TreeCell is one figure: operations per second, all clients together.
type TreeCell struct {
	Figure  int // 6: a private tree per client; 7: one shared tree, disjoint key ranges
	Shape   string
	Clients int
	Phase   string // insert, lookup-cold, lookup-warm, delete; etcd-put, etcd-get, grove-put, grove-get (Figure 0: the etcd comparison)
	OpsPerS float64
	P50     time.Duration // the etcd comparison's median latency
}

// TreeResults are the benchmark's cells.
type TreeResults struct {
	Cells   []TreeCell
	Servers int
}

// TreeBench runs Figures 6 and 7 on a 3-node in-process cluster (each node
// a B-tree server; client i works through node i mod 3, as Boxwood's
// machines each ran their own B-tree module): every client inserts Ops
// keys, then looks each up (caches emptied first: cold; then again: warm),
// then deletes each, one operation at a time, every one durable when it
// returns. Before each cold phase every server writes back and gives up
// its cache, as Boxwood evicted its caches.
func TreeBench(ctx context.Context, dir string, o TreeOptions, progress io.Writer) (*TreeResults, error) {
	c, err := StartCluster(dir, 3, ClusterOptions{Store: true, DiskSize: 1 << 30})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	for _, nodes := range [][2]uint64{{1, 2}, {2, 3}, {3, 1}} {
		for i := 0; ; i++ {
			if _, err = chunk.CreatePair(ctx, mc, nodes, 16<<20, 256<<20); err == nil {
				break
			}
			if i == 100 || ctx.Err() != nil {
				return nil, err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	servers := make([]*btree.Server, 3)
	for i := range servers {
		// A server that cannot start (no room for its log on the node's
		// disk, say) retries for ever: each wait is bounded, and after 3
		// minutes the bench gives up with the server's last error.
		for start := time.Now(); ; {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			s, err := c.Nodes[i].BTree().Server(sctx)
			cancel()
			if err == nil {
				servers[i] = s
				break
			}
			if ctx.Err() != nil {
				return nil, err
			}
			if time.Since(start) > 3*time.Minute {
				return nil, fmt.Errorf("node %d's B-tree server did not start in 3 minutes: %w", i+1, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	res := &TreeResults{Servers: 3}
	seq := 0
	for _, shape := range o.Shapes {
		if o.NoFigures {
			break
		}
		cfg := btree.Config{}
		keyLen, valLen := shapeSizes(shape)
		if shape == "paper" {
			cfg.MaxFanout = 6
		}
		for _, fig := range []int{6, 7} {
			for _, clients := range o.Clients {
				phases := map[string][]float64{}
				for r := 0; r < o.Rounds; r++ {
					seq++
					trees := make([]*btree.Tree, clients)
					names := map[int]string{}
					for i := range trees {
						name := fmt.Sprintf("bench-%d-%d", seq, i)
						if fig == 7 {
							name = fmt.Sprintf("bench-%d", seq)
						}
						names[i] = name
						if i == 0 || fig == 6 {
							if _, err := servers[0].CreateTree(ctx, name, cfg); err != nil {
								return nil, err
							}
						}
					}
					for i := range trees {
						if trees[i], err = servers[i%3].Open(ctx, names[i]); err != nil {
							return nil, err
						}
					}
					key := func(client, i int) []byte {
						// Disjoint ranges per client (Figure 7); spread within.
						k := fmt.Sprintf("%02d%0*d", client, keyLen-2, (i*7919)%o.Ops)
						return []byte(k[:keyLen])
					}
					val := make([]byte, valLen)
					for i := range val {
						val[i] = 'v'
					}
					run := func(phase string, op func(t *btree.Tree, client, i int) error) error {
						start := time.Now()
						var wg sync.WaitGroup
						errs := make(chan error, clients)
						for cl := 0; cl < clients; cl++ {
							wg.Add(1)
							go func(cl int) {
								defer wg.Done()
								for i := 0; i < o.Ops; i++ {
									if err := op(trees[cl], cl, i); err != nil {
										errs <- fmt.Errorf("%s: %w", phase, err)
										return
									}
								}
							}(cl)
						}
						wg.Wait()
						close(errs)
						if err := <-errs; err != nil {
							return err
						}
						phases[phase] = append(phases[phase], float64(clients*o.Ops)/time.Since(start).Seconds())
						return nil
					}
					evict := func() {
						for _, s := range servers {
							s.Cache().ReleaseAll()
						}
					}
					get := func(t *btree.Tree, cl, i int) error {
						_, ok, err := t.Get(ctx, key(cl, i))
						if err == nil && !ok {
							err = fmt.Errorf("key %q missing", key(cl, i))
						}
						return err
					}
					steps := []struct {
						phase string
						pre   func()
						op    func(t *btree.Tree, cl, i int) error
					}{
						{"insert", evict, func(t *btree.Tree, cl, i int) error {
							_, err := t.Put(ctx, key(cl, i), val, btree.Cond{})
							return err
						}},
						{"lookup-cold", evict, get},
						{"lookup-warm", nil, get},
						{"delete", evict, func(t *btree.Tree, cl, i int) error {
							_, err := t.Delete(ctx, key(cl, i), btree.Cond{})
							return err
						}},
					}
					for _, st := range steps {
						if st.pre != nil {
							st.pre()
						}
						if err := run(st.phase, st.op); err != nil {
							return nil, err
						}
					}
					for i := range trees {
						if i == 0 || fig == 6 {
							if err := servers[0].DropTree(ctx, names[i]); err != nil {
								return nil, err
							}
						}
					}
				}
				for _, phase := range []string{"insert", "lookup-cold", "lookup-warm", "delete"} {
					cell := TreeCell{Figure: fig, Shape: shape, Clients: clients, Phase: phase, OpsPerS: medianF(phases[phase])}
					res.Cells = append(res.Cells, cell)
					fmt.Fprintf(progress, "  figure %d, %s keys, %d clients, %s: %.0f ops/s\n", fig, shape, clients, phase, cell.OpsPerS)
				}
			}
		}
	}
	if o.Etcd {
		if err := etcdCompare(ctx, dir, c, o, res, progress); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// etcdCompare runs the same etcd v3 load against etcd and against Grove's
// etcd-compatible endpoint: clients workers, each on its own connection
// (round robin over the three members or nodes, as etcd's benchmark tool
// spreads its connections), each putting Ops keys one at a time, then
// reading each back with a linearizable single-key range. Both are equally
// durable: etcd acknowledges a put once a majority (2 of 3) has it in its
// fsynced WAL, Grove once the answering node's log has it on two disks.
func etcdCompare(ctx context.Context, dir string, c *InProcessCluster, o TreeOptions, res *TreeResults, progress io.Writer) error {
	edir := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(edir, 0o755); err != nil {
		return err
	}
	e, err := StartEtcd(edir, 3)
	if err != nil {
		return err
	}
	defer e.Close()
	var grove []string
	for _, cfg := range c.Configs {
		grove = append(grove, cfg.GRPCAddr)
	}
	dial := func(addrs []string) ([]*grpc.ClientConn, error) {
		var out []*grpc.ClientConn
		for _, a := range addrs {
			cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, err
			}
			out = append(out, cc)
		}
		return out, nil
	}
	// etcd is ready once it has a leader.
	econns, err := dial(e.Clients)
	if err != nil {
		return err
	}
	defer func() {
		for _, cc := range econns {
			cc.Close()
		}
	}()
	if _, err := e.leader(ctx, econns); err != nil {
		return err
	}
	seq := 0
	for _, shape := range o.Shapes {
		keyLen, valLen := shapeSizes(shape)
		val := bytes.Repeat([]byte{'v'}, valLen)
		for _, clients := range o.Clients {
			cells := map[string][]Result{}
			for r := 0; r < o.Rounds; r++ {
				for _, sys := range []struct {
					name  string
					addrs []string
				}{{"etcd", e.Clients}, {"grove", grove}} {
					seq++
					conns, err := dial(repeatTo(sys.addrs, clients))
					if err != nil {
						return err
					}
					kvs := make([]etcdpb.KVClient, clients)
					for i := range kvs {
						kvs[i] = etcdpb.NewKVClient(conns[i])
					}
					key := func(w, i int) []byte {
						// Spread over the key space (as etcd's benchmark
						// picks random keys), distinct per round, worker
						// and operation.
						x := splitmix(uint64(seq)<<40 | uint64(w)<<24 | uint64(i))
						return []byte(fmt.Sprintf("%0*d", keyLen, x%pow10(keyLen)))
					}
					stopProfile := profilePhase(sys.name + "-put")
					put, err := runLoad(sys.name, clients, clients*o.Ops, func(w, i int) error {
						cctx, cancel := context.WithTimeout(ctx, time.Minute)
						defer cancel()
						_, err := kvs[w].Put(cctx, &etcdpb.PutRequest{Key: key(w, i), Value: val})
						return err
					})
					stopProfile()
					if err == nil {
						cells[sys.name+"-put"] = append(cells[sys.name+"-put"], put)
						var get Result
						stopProfile = profilePhase(sys.name + "-get")
						get, err = runLoad(sys.name, clients, clients*o.Ops, func(w, i int) error {
							cctx, cancel := context.WithTimeout(ctx, time.Minute)
							defer cancel()
							r, err := kvs[w].Range(cctx, &etcdpb.RangeRequest{Key: key(w, i)})
							if err == nil && len(r.Kvs) != 1 {
								err = fmt.Errorf("%s: key %q missing", sys.name, key(w, i))
							}
							return err
						})
						stopProfile()
						cells[sys.name+"-get"] = append(cells[sys.name+"-get"], get)
					}
					for _, cc := range conns {
						cc.Close()
					}
					if err != nil {
						return fmt.Errorf("%s, %d clients: %w", sys.name, clients, err)
					}
				}
			}
			for _, phase := range []string{"etcd-put", "grove-put", "etcd-get", "grove-get"} {
				rs := cells[phase]
				var rates []float64
				var p50s, p99s []time.Duration
				for _, r := range rs {
					rates = append(rates, r.PerSec())
					p50s = append(p50s, r.P50)
					p99s = append(p99s, r.P99)
				}
				sort.Slice(p50s, func(i, j int) bool { return p50s[i] < p50s[j] })
				sort.Slice(p99s, func(i, j int) bool { return p99s[i] < p99s[j] })
				cell := TreeCell{Figure: 0, Shape: shape, Clients: clients, Phase: phase, OpsPerS: medianF(rates), P50: p50s[len(p50s)/2]}
				res.Cells = append(res.Cells, cell)
				fmt.Fprintf(progress, "  etcd comparison, %s keys, %d clients, %s: %.0f ops/s, median latency %v, p99 %v\n", shape, clients, phase, cell.OpsPerS, cell.P50.Round(time.Microsecond), p99s[len(p99s)/2].Round(time.Microsecond))
			}
		}
	}
	return nil
}

// profilePhase writes a CPU profile of one phase of the etcd comparison
// to $GROVE_BENCH_CPUPROFILE.PHASE.N (a tuning aid; off unless set):
// the in-process nodes and the load generator, not the etcd members.
func profilePhase(phase string) (stop func()) {
	base := os.Getenv("GROVE_BENCH_CPUPROFILE")
	if base == "" {
		return func() {}
	}
	for n := 1; ; n++ {
		name := fmt.Sprintf("%s.%s.%d", base, phase, n)
		if _, err := os.Stat(name); err == nil {
			continue
		}
		f, err := os.Create(name)
		if err != nil {
			return func() {}
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return func() {}
		}
		// The phase's lock contention too (mutex and block profiles).
		runtime.SetMutexProfileFraction(5)
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
		return func() {
			pprof.StopCPUProfile()
			f.Close()
			for _, p := range []string{"mutex", "block"} {
				if g, err := os.Create(name + "." + p); err == nil {
					_ = pprof.Lookup(p).WriteTo(g, 0)
					g.Close()
				}
			}
			runtime.SetMutexProfileFraction(0)
			runtime.SetBlockProfileRate(0)
		}
	}
}

// splitmix is SplitMix64's finalizer: a bijection that spreads keys.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// pow10 is 10^n, capped at 10^19.
func pow10(n int) uint64 {
	p := uint64(1)
	for i := 0; i < n && i < 19; i++ {
		p *= 10
	}
	return p
}

// repeatTo lists n addresses, going round addrs.
func repeatTo(addrs []string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = addrs[i%len(addrs)]
	}
	return out
}

// shapeSizes are a shape's key and value lengths: "paper" Boxwood's 10 and
// 10 bytes, "big" 16 and 256, "large" 16 bytes and 64 KiB (each value in a
// chunk of its own).
func shapeSizes(shape string) (keyLen, valLen int) {
	switch shape {
	case "paper":
		return 10, 10
	case "large":
		return 16, 64 << 10
	}
	return 16, 256
}
