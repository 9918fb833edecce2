package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestBootstrapIfNewLateMember: every member started with
// --bootstrap-if-new, one of them late (CI's compose run: the third
// container started after the other two had elected a leader, found "a
// cluster that has run", and refused to start for good). The late member
// joins empty, because both others vouch that they never counted its raft
// answers, and the cluster is healthy with it. Then one member is killed
// with SIGKILL and its directory is lost: started again the same way, it
// must refuse. The follower case: the leader counted its acknowledgements
// (a voter that forgot them could help lose a committed decree). The
// leader case: nobody counted the leader's answers (it did the counting),
// but its followers accepted its appends and recorded it; before the
// receiving side of meta/counted.go, a leader that lost its directory was
// vouched for and joined empty, and with the other follower behind, an
// empty voter's vote could elect a leader without a committed decree.
func TestBootstrapIfNewLateMember(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	for _, tc := range []struct {
		victim string
		base   int
	}{{"follower", 10400}, {"leader", 10500}, {"reboot", 10600}} {
		t.Run(tc.victim, func(t *testing.T) {
			t.Parallel() // its own ports and directories: see parallelTests
			lateMemberThenLoss(t, tc.base, tc.victim)
		})
	}
}

// lateMemberThenLoss: victim is "follower" (member 2 loses its directory),
// "leader" (the leader does), or "reboot" (every member is killed, member
// 3's directory goes, and all three start again together: the two that
// kept their state answer commit index 0 until they elect a leader, since
// hashicorp/raft keeps none on disk, and member 3 must not take that for a
// new cluster; outside review 116).
func lateMemberThenLoss(t *testing.T, base int, victimKind string) {
	claimPorts(t, base)
	bin := buildGrove(t)
	dir := t.TempDir()
	addr := func(id, k int) string { return fmt.Sprintf("127.0.0.1:%d", base+id*10+k) }
	var members strings.Builder
	for id := 1; id <= 3; id++ {
		fmt.Fprintf(&members, "\n[[members]]\nid = %d\ngrpc = %q\nraft = %q\nbeacon = %q\n", id, addr(id, 0), addr(id, 1), addr(id, 2))
	}
	cfgPath := func(id int) string { return filepath.Join(dir, fmt.Sprintf("node-%d.toml", id)) }
	dataDir := func(id int) string { return filepath.Join(dir, fmt.Sprintf("node-%d", id)) }
	for id := 1; id <= 3; id++ {
		cfg := fmt.Sprintf("id = %d\ndata_dir = %q\ngrpc_addr = %q\nraft_addr = %q\nbeacon_addr = %q\nroles = [\"meta\", \"observer\", \"lock\"]\ncluster_key = %q\n%s",
			id, dataDir(id), addr(id, 0), addr(id, 1), addr(id, 2), strings.Repeat("cd", 32), members.String())
		if err := os.WriteFile(cfgPath(id), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	type proc struct {
		cmd  *exec.Cmd
		done chan error
		out  *lockedBuf
	}
	start := func(id int) *proc {
		t.Helper()
		p := &proc{cmd: exec.Command(bin, "server", "--config", cfgPath(id), "--bootstrap-if-new"), done: make(chan error, 1), out: &lockedBuf{}}
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.done <- p.cmd.Wait() }()
		t.Cleanup(func() {
			p.cmd.Process.Kill()
			<-p.done
		})
		return p
	}
	logOf := func(id int) string {
		b, _ := os.ReadFile(filepath.Join(dataDir(id), "grove.log"))
		return string(b)
	}
	defer func() {
		if t.Failed() {
			for id := 1; id <= 3; id++ {
				t.Logf("node %d's log:\n%s", id, logOf(id))
			}
		}
	}()
	procs := map[int]*proc{1: start(1), 3: start(3)}
	waitFor(t, 60*time.Second, "nodes 1 and 3 registered (the cluster has run)", func() bool {
		return strings.Contains(logOf(1), "msg=registered") && strings.Contains(logOf(3), "msg=registered")
	})

	late := start(2)
	procs[2] = late
	waitFor(t, 60*time.Second, "node 2 joins as a new member", func() bool {
		return strings.Contains(logOf(2), "joining a cluster that has run as a new member")
	})
	all := addr(1, 0) + "," + addr(2, 0) + "," + addr(3, 0)
	waitFor(t, 60*time.Second, "the cluster healthy with node 2", func() bool {
		return grove(t, bin, nil, "health", "--endpoints", all, "--command-timeout", "5s").code == 0
	})
	waitFor(t, 30*time.Second, "node 2 a raft follower with a commit index", func() bool {
		r := grove(t, bin, nil, "status", "--endpoints", all, "-o", "json")
		if r.code != 0 {
			return false
		}
		st := parseStatus(t, []byte(r.stdout))
		for _, m := range st.Members {
			if m.Member == 2 && m.Voter && m.RaftState == "follower" {
				return true
			}
		}
		return false
	})

	// Lost: SIGKILL, and the directory goes. The same command line must
	// now refuse, and say why.
	victim, vp := 2, late
	if victimKind == "reboot" {
		for id := 1; id <= 3; id++ {
			procs[id].cmd.Process.Signal(syscall.SIGKILL)
			procs[id].done <- <-procs[id].done
		}
		if err := os.RemoveAll(dataDir(3)); err != nil {
			t.Fatal(err)
		}
		// Member 3 first, the others a moment later: its probe meets
		// them before they elect a leader.
		vp = start(3)
		time.Sleep(300 * time.Millisecond)
		start(1)
		start(2)
		victim = 3
	}
	if victimKind == "leader" {
		r := grove(t, bin, nil, "status", "--endpoints", all, "-o", "json")
		st := parseStatus(t, []byte(r.stdout))
		if r.code != 0 || st.Leader == 0 {
			t.Fatalf("no leader in status (exit %d):\n%s", r.code, r.stdout)
		}
		victim, vp = int(st.Leader), procs[int(st.Leader)]
	}
	if victimKind != "reboot" {
		t.Logf("killing member %d and removing its directory", victim)
		vp.cmd.Process.Signal(syscall.SIGKILL)
		vp.done <- <-vp.done // put back for the cleanup
		if err := os.RemoveAll(dataDir(victim)); err != nil {
			t.Fatal(err)
		}
	}
	again := vp
	if victimKind != "reboot" {
		again = start(victim)
	}
	select {
	case err := <-again.done:
		again.done <- err // for the cleanup
		if err == nil {
			t.Fatalf("member %d without its state exited 0:\n%s", victim, again.out)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("member %d without its state did not refuse within 90 s:\n%s\nits log:\n%s", victim, again.out, logOf(victim))
	}
	if out := again.out.String(); !strings.Contains(out, "lost its data") || !strings.Contains(out, "did not join it as a new member: member") {
		t.Fatalf("member %d's refusal does not say it lost its data, and which member counted it:\n%s", victim, out)
	}
	if l := logOf(victim); !strings.Contains(l, "counted this member's vote or acknowledgement: this member lost its raft state") {
		t.Fatalf("member %d's log does not say which member counted it:\n%s", victim, l)
	}
}

// lockedBuf is a process's output, written by exec's copier and read by the
// test.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
