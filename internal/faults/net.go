package faults

import (
	"bytes"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Prefix starts the name of every network namespace and interface the suite
// creates, so that a run can find and remove what an aborted earlier run
// left behind without touching anything else on the machine. Interface
// names stay within the kernel's 15 characters.
const Prefix = "gf-"

const (
	bridgeNS   = Prefix + "br"  // the bridge's own namespace
	bridgeDev  = Prefix + "br0" // the bridge, inside bridgeNS
	clientNS   = Prefix + "c"   // where the agent (the cluster's client) runs
	clientPort = Prefix + "pc"  // the client's port on the bridge
	subnet     = "10.213.0."
	// ClientAddr is the client namespace's address.
	ClientAddr = subnet + "100"
	// nftTable and nftChain hold every fault rule, in bridgeNS: a bridge
	// family table sees each forwarded frame once, with the ports it came
	// in and goes out by, which is exactly one link of the topology.
	nftTable = "bridge gf"
	nftChain = "cuts"
)

// NodeNS is node i's namespace, NodeAddr its address, nodePort its port on
// the bridge.
func NodeNS(i int) string   { return fmt.Sprintf("%sn%d", Prefix, i) }
func NodeAddr(i int) string { return subnet + strconv.Itoa(i) }
func nodePort(i int) string { return fmt.Sprintf("%sp%d", Prefix, i) }

// Net is the test network: a bridge in a namespace of its own (the host's
// firewall, which drops forwarded bridge traffic, never sees its frames),
// one namespace per node and one for the client, each joined to the bridge
// by a veth pair whose inner end is eth0. Faults are nftables rules on the
// bridge's forward hook: this kernel has no netem, so loss is a random drop
// (numgen) and a partition a drop by port. Rules match IPv4 only, so that
// ARP keeps working and a heal takes effect at once, with no neighbour
// entries to re-resolve.
type Net struct {
	Nodes int
}

// sh runs a command and returns its error with its output.
func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// CleanStale removes what an earlier run left: every namespace named with
// Prefix, after killing the processes inside it (only this suite starts
// processes in those namespaces: grove nodes and the agent). logf reports
// what it removed.
func CleanStale(logf func(string, ...any)) error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], Prefix) {
			continue
		}
		ns := f[0]
		pids, _ := exec.Command("ip", "netns", "pids", ns).Output()
		for _, p := range strings.Fields(string(pids)) {
			if pid, err := strconv.Atoi(p); err == nil {
				logf("stale run: killing pid %d in namespace %s", pid, ns)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		logf("stale run: deleting namespace %s", ns)
		if err := sh("ip", "netns", "del", ns); err != nil && !strings.Contains(err.Error(), "No such file") {
			return err // (a namespace that vanished meanwhile is gone: fine)
		}
	}
	return nil
}

// Setup creates the topology for nodes nodes and the client. On error it
// removes whatever it created.
func Setup(nodes int) (n *Net, err error) {
	n = &Net{Nodes: nodes}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	steps := [][]string{
		{"ip", "netns", "add", bridgeNS},
		{"ip", "-n", bridgeNS, "link", "set", "lo", "up"},
		{"ip", "-n", bridgeNS, "link", "add", bridgeDev, "type", "bridge"},
		{"ip", "-n", bridgeNS, "link", "set", bridgeDev, "up"},
	}
	for _, s := range steps {
		if err := sh(s...); err != nil {
			return nil, err
		}
	}
	if err := n.nft(fmt.Sprintf("add table %s\nadd chain %s %s { type filter hook forward priority 0; policy accept; }\n",
		nftTable, nftTable, nftChain)); err != nil {
		return nil, err
	}
	for i := 1; i <= nodes; i++ {
		if err := attach(NodeNS(i), nodePort(i), NodeAddr(i)); err != nil {
			return nil, err
		}
	}
	if err := attach(clientNS, clientPort, ClientAddr); err != nil {
		return nil, err
	}
	return n, nil
}

// attach creates namespace ns with eth0 at addr, joined to the bridge by
// port. Both ends of the veth pair are created in their namespaces at once:
// nothing is ever added to the host's own namespace.
func attach(ns, port, addr string) error {
	for _, s := range [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "link", "add", port, "netns", bridgeNS, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "-n", ns, "addr", "add", addr + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", bridgeNS, "link", "set", port, "master", bridgeDev},
		{"ip", "-n", bridgeNS, "link", "set", port, "up"},
	} {
		if err := sh(s...); err != nil {
			return err
		}
	}
	return nil
}

// Close deletes every namespace of the topology (with them go the veth
// pairs, the bridge and the nftables table). The processes in them must
// have been stopped first.
func (n *Net) Close() {
	sh("ip", "netns", "del", clientNS)
	for i := 1; i <= n.Nodes; i++ {
		sh("ip", "netns", "del", NodeNS(i))
	}
	sh("ip", "netns", "del", bridgeNS)
}

// nft runs an nftables script in the bridge namespace: one transaction, so
// a fault made of several rules starts at one instant.
func (n *Net) nft(script string) error {
	cmd := exec.Command("ip", "netns", "exec", bridgeNS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %v: %s\nscript:\n%s", err, bytes.TrimSpace(out), script)
	}
	return nil
}

func (n *Net) addRules(rules ...string) (time.Time, error) {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "add rule %s %s ether type ip %s drop\n", nftTable, nftChain, r)
	}
	err := n.nft(b.String())
	return time.Now(), err
}

// Isolate silently drops everything between node i and every other
// endpoint (nodes and client), both ways. It returns when the rules are in
// force.
func (n *Net) Isolate(i int) (time.Time, error) {
	p := strconv.Quote(nodePort(i))
	return n.addRules("iifname "+p, "oifname "+p)
}

// Cut drops what node from sends to node to; the other direction still
// flows.
func (n *Net) Cut(from, to int) (time.Time, error) {
	return n.addRules(fmt.Sprintf("iifname %q oifname %q", nodePort(from), nodePort(to)))
}

// Loss drops pct % of the packets on every link, independently.
func (n *Net) Loss(pct int) (time.Time, error) {
	return n.addRules(fmt.Sprintf("numgen random mod 100 < %d", pct))
}

// Heal removes every fault rule.
func (n *Net) Heal() (time.Time, error) {
	err := n.nft(fmt.Sprintf("flush chain %s %s\n", nftTable, nftChain))
	return time.Now(), err
}

// Exec returns a command that runs name with args inside namespace ns.
func Exec(ns, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
}
