package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is a proxy the bench started, the broker or a peer, with the start of its output.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	out    strings.Builder // the first 64 KiB of output, for error messages
}

// startProcess starts cmd and reads its standard error, and its standard output unless cmd
// already has one, line by line; watch (if not nil) sees every line.
func startProcess(cmd *exec.Cmd, watch func(line string)) (*process, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = w
	if cmd.Stdout == nil {
		cmd.Stdout = w
	}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	w.Close()
	p := &process{cmd: cmd, exited: make(chan struct{})}
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if watch != nil {
				watch(line)
			}
			p.mu.Lock()
			if p.out.Len() < 64<<10 {
				p.out.WriteString(line + "\n")
			}
			p.mu.Unlock()
		}
	}()
	go func() {
		_ = cmd.Wait()
		<-lines
		close(p.exited)
	}()
	return p, nil
}

// output is the start of what the process wrote.
func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.TrimSpace(p.out.String())
}

func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// waitListening waits until addr accepts a connection, the process exits, or d passes.
func (p *process) waitListening(addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited at start: %s", p.output())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after %s: %s", addr, d, p.output())
		}
	}
}

// cpu returns the user+system CPU time so far of the process and its descendants (helpers
// such as squid's certificate generator), from /proc/<pid>/stat, including children that
// have exited and been waited for.
func (p *process) cpu() time.Duration {
	pids := []int{p.cmd.Process.Pid}
	parent := parents()
	for i := 0; i < len(pids); i++ {
		for child, pp := range parent {
			if pp == pids[i] {
				pids = append(pids, child)
			}
		}
	}
	var ticks int64
	for _, pid := range pids {
		f := statFields(pid)
		if len(f) < 15 {
			continue
		}
		// utime, stime, cutime, cstime are fields 14-17, 11-14 after the command name.
		for _, v := range f[11:15] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
	}
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ticks) * time.Second / clkTck
}

// statFields are the fields of /proc/<pid>/stat after the parenthesised command name.
func statFields(pid int) []string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return nil
	}
	return strings.Fields(s[i+2:])
}

// parents maps every running process to its parent.
func parents() map[int]int {
	m := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(pid); len(f) > 1 {
			m[pid], _ = strconv.Atoi(f[1])
		}
	}
	return m
}

// rss returns the process's resident set size in bytes, from /proc/<pid>/status.
func (p *process) rss() int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// startServing starts a peer's cmd and waits until it accepts connections on addr.
func startServing(cmd *exec.Cmd, addr string) (*process, error) {
	proc, err := startProcess(cmd, nil)
	if err != nil {
		return nil, err
	}
	if err := proc.waitListening(addr, 30*time.Second); err != nil {
		proc.stop()
		return nil, err
	}
	return proc, nil
}

// settle waits, up to limit, until the proxies have gone quiet: under 5 ms of CPU among them
// in 100 ms. A proxy still working off the queue of a phase that has ended (mitmproxy, whose
// throughput is far below what it was offered at 128 connections) would otherwise take CPU
// from the next path measured, and its latency would be charged to that path. It returns how
// long it waited, and whether they went quiet.
func settle(procs []*process, limit time.Duration) (time.Duration, bool) {
	total := func() (t time.Duration) {
		for _, p := range procs {
			t += p.cpu()
		}
		return t
	}
	const window, quiet = 100 * time.Millisecond, 5 * time.Millisecond
	start := time.Now()
	before := total()
	for time.Since(start) < limit {
		time.Sleep(window)
		now := total()
		if now-before < quiet {
			return time.Since(start), true
		}
		before = now
	}
	return time.Since(start), false
}

// settleBefore settles the proxies (up to 10 s) before what is measured next, and says so when
// it waited over a second, or in vain.
func settleBefore(procs []*process, what string) {
	switch waited, quiet := settle(procs, 10*time.Second); {
	case !quiet:
		fmt.Fprintf(stderr, "  %s: the proxies were still busy after %s; measuring anyway\n", what, waited.Round(time.Second))
	case waited > time.Second:
		fmt.Fprintf(stderr, "  %s: waited %s for the proxies to go quiet\n", what, waited.Round(100*time.Millisecond))
	}
}

// machineCPU is the machine's CPU time so far, from the first line of /proc/stat, in clock
// ticks: all of it, and the part stolen by the hypervisor (time the VM wanted to run and was
// not given a CPU). Zero when /proc/stat cannot be read.
type machineCPU struct{ total, steal, idle uint64 }

func readMachineCPU() machineCPU {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	return parseMachineCPU(line)
}

// parseMachineCPU reads /proc/stat's first line: cpu user nice system idle iowait irq softirq
// steal guest guest_nice. Guest time is left out of the total: it is also counted in user.
func parseMachineCPU(line string) machineCPU {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}
	}
	var c machineCPU
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return machineCPU{}
		}
		c.total += v
		switch i {
		case 3, 4: // idle, iowait
			c.idle += v
		case 7:
			c.steal = v
		}
	}
	return c
}

// since is the machine's CPU time from c0 to c (c - c0; zero when the clock did not move).
func (c machineCPU) since(c0 machineCPU) machineCPU {
	if c.total <= c0.total {
		return machineCPU{}
	}
	return machineCPU{total: c.total - c0.total, steal: c.steal - c0.steal, idle: c.idle - c0.idle}
}

// stealFraction is the fraction of c stolen by the hypervisor.
func (c machineCPU) stealFraction() float64 {
	if c.total == 0 {
		return 0
	}
	return float64(c.steal) / float64(c.total)
}

// busyUS is the part of c spent (every process's, the kernel's included; not idle, not
// stolen), in microseconds: /proc/stat counts in USER_HZ ticks, 100 a second on Linux.
func (c machineCPU) busyUS() float64 { return float64(c.total-c.idle-c.steal) * 1e4 }
