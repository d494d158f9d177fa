// Package proccpu reads the CPU time processes have used (Linux /proc and
// getrusage), for the benchmarks' CPU-seconds-per-GB columns.
package proccpu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat; the kernel fixes
// it at 100 for user space on every Linux architecture Go supports.
const userHZ = 100

// Stat returns utime+stime, in seconds, from the text of a
// /proc/<pid>/stat file: the CPU time of all the process's threads, those
// that exited included.
func Stat(stat string) (float64, error) {
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after it start past the last ')'.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat: no command name in %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name", len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc stat: bad utime/stime %q %q", f[11], f[12])
	}
	return float64(ut+st) / userHZ, nil
}

// Of returns the CPU time pid has used so far, in seconds.
func Of(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return Stat(string(b))
}

// Self returns this process's CPU time in seconds, at microsecond
// resolution.
func Self() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
