package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pgLayout is where the Postgres bench's processes run. In "one machine" everything shares
// every CPU, and whatever the broker or relay spends comes out of the server's time: on two
// cores that measures the machine's contention as much as the front door. In "database on
// its own CPU" the server's processes have CPU 0 and pgbench, the broker or relay (this
// process, and every process it starts from then on) the others: as in a deployment, where
// the database runs on a machine of its own and the broker beside the agent. The target is
// read from the second; both are printed.
type pgLayout struct {
	name       string
	server     unix.CPUSet // the server's CPUs
	everything unix.CPUSet // this process's, and so pgbench's and the broker's
}

// pgLayouts are the layouts this machine can run: "database on its own CPU" needs two CPUs.
func pgLayouts() []pgLayout {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil || all.Count() < 2 {
		return []pgLayout{{name: "one machine (every process on every CPU)", server: all, everything: all}}
	}
	var first, rest unix.CPUSet
	n := 0
	for i := range 1024 {
		if !all.IsSet(i) {
			continue
		}
		if n == 0 {
			first.Set(i)
		} else {
			rest.Set(i)
		}
		n++
	}
	return []pgLayout{
		{name: "one machine (every process on every CPU)", server: all, everything: all},
		{name: fmt.Sprintf("database on its own CPU (the server on 1 CPU, pgbench and the broker or relay on %d)", rest.Count()), server: first, everything: rest},
	}
}

// place moves the server (the postmaster at pid and its children: a backend forked later
// inherits the postmaster's CPUs) and this process's threads onto the layout's CPUs.
func (l pgLayout) place(postmaster int) error {
	pids := []int{postmaster}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after its ')'.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(postmaster) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		if err := setAffinity(pid, &l.server); err != nil {
			return fmt.Errorf("placing the server's process %d: %w", pid, err)
		}
	}
	return setAffinity(os.Getpid(), &l.everything)
}

// setAffinity sets the CPUs of every thread of process pid; threads it starts later inherit
// them.
func setAffinity(pid int, set *unix.CPUSet) error {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*", pid))
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("no threads of %d", pid)
	}
	for _, t := range tasks {
		tid, _ := strconv.Atoi(filepath.Base(t))
		if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
			return err
		}
	}
	return nil
}
