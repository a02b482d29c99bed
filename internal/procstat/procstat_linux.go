//go:build linux

// Package procstat reads CPU time of this process and of a local PostgreSQL
// server from /proc, for the benchmarks.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux platform Go supports).
const clockTick = 10 * time.Millisecond

// CPU is the CPU time (user + system) spent so far by the PostgreSQL
// server whose postmaster is postmaster (its live processes plus the
// children it has reaped) and by this process. ok is false when the
// server's processes cannot be read (a server on another machine).
func CPU(postmaster int) (server, client time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if postmaster <= 0 {
		return 0, client, false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, client, false
	}
	var ticks int64
	found := false
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(pid)
		if err != nil {
			continue
		}
		switch {
		case pid == postmaster:
			ticks += f[11] + f[12] + f[13] + f[14] // own and reaped children's
			found = true
		case f[1] == int64(postmaster):
			ticks += f[11] + f[12]
		}
	}
	return time.Duration(ticks) * clockTick, client, found
}

// procStat returns the numeric fields of /proc/pid/stat after the command
// name: [0] is state (0), [1] ppid, [2] pgrp, …, [11] utime, [12] stime,
// [13] cutime, [14] cstime.
func procStat(pid int) ([]int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("bad stat for %d", pid)
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 15 {
		return nil, fmt.Errorf("short stat for %d", pid)
	}
	out := make([]int64, 15)
	for k := 1; k < 15; k++ {
		out[k], _ = strconv.ParseInt(fields[k], 10, 64)
	}
	return out, nil
}

// PostmasterOf returns the postmaster of the backend with pid backend, or 0
// when it is not a local process.
func PostmasterOf(backend int) int {
	f, err := procStat(backend)
	if err != nil {
		return 0
	}
	comm, err := os.ReadFile("/proc/" + strconv.FormatInt(f[1], 10) + "/comm")
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres") {
		return 0
	}
	return int(f[1])
}
