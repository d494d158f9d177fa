package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory and process facts from /proc (Linux only, like the shm data plane).

// statusKB returns the kB value of field (e.g. "VmHWM") in the text of a
// /proc/<pid>/status file.
func statusKB(status, field string) (int64, error) {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc status: %s: unexpected value %q", field, strings.TrimSpace(rest))
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("/proc status: %s: bad number %q", field, f[0])
		}
		return v, nil
	}
	return 0, fmt.Errorf("/proc status: no %s field", field)
}

// peakRSS returns the process's VmHWM (peak resident set) in bytes.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	kb, err := statusKB(string(b), "VmHWM")
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return kb << 10, nil
}

// resetPeakRSS sets the process's VmHWM back to its current RSS (clear_refs
// value 5, Linux ≥ 4.0), so the next reading covers only what follows.
func resetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// firstField returns the value of the first "key : value" line with key in
// a /proc text file such as cpuinfo or meminfo, or "".
func firstField(path, key string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
