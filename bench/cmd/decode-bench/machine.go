package main

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// machine is what the page says of the box the run was on.
type machine struct {
	CPU    string
	Cores  int
	Memory string
	GPUs   []string // nvidia-smi: name, driver, memory
	Kernel string
	Go     string
	// LoadStart is /proc/loadavg's 1, 5 and 15 minute averages at the start.
	LoadStart string
}

func probeMachine(ctx context.Context) machine {
	m := machine{CPU: cpuModel(), Cores: runtime.NumCPU(), Memory: memTotal(), Go: runtime.Version(), LoadStart: loadAvg()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader").Output(); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				m.GPUs = append(m.GPUs, l)
			}
		}
	}
	return m
}

// GPUName is the first GPU's model, or "no GPU".
func (m machine) GPUName() string {
	if len(m.GPUs) == 0 {
		return "no GPU"
	}
	name, _, _ := strings.Cut(m.GPUs[0], ",")
	return strings.TrimSpace(name)
}

// tag names the machine in the page's file name: the GPU's model ("NVIDIA
// H200" → h200, "NVIDIA A100-SXM4-80GB" → a100), else cpu.
func (m machine) tag() string {
	if len(m.GPUs) == 0 {
		return "cpu"
	}
	f := strings.Fields(m.GPUName())
	for i := len(f) - 1; i >= 0; i-- {
		w, _, _ := strings.Cut(strings.ToLower(f[i]), "-")
		if strings.ContainsAny(w, "0123456789") {
			return w
		}
	}
	return "gpu"
}

// loadAvg is the 1, 5 and 15 minute load averages, "?" where unknown.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "MemTotal:" && f[2] == "kB" {
			if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
				return fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	return ""
}

// binary is one executable of the run: its Go module version, and the C
// flags it was built with (the sidecar file BINARY.cflags the build writes:
// -trimpath keeps CGO_CFLAGS out of Go's build info).
type binary struct {
	Role, Path, Version, CFlags string
}

func describeBinaries(o options) []binary {
	list := []binary{
		{Role: "engine", Path: filepath.Join(o.bin, "hydra-engine")},
		{Role: "llama plugin", Path: o.plugin},
		{Role: "Ollama", Path: o.ollama},
		{Role: "llama-batched", Path: o.llamaBatched},
	}
	var out []binary
	for _, b := range list {
		if _, err := os.Stat(b.Path); err != nil {
			continue
		}
		b.Version = moduleVersion(b.Path)
		switch cf, err := os.ReadFile(b.Path + ".cflags"); {
		case err == nil:
			b.CFlags = strings.TrimSpace(string(cf))
		case !usesCgo(b.Path):
			b.CFlags = "none: pure Go"
		}
		out = append(out, b)
	}
	return out
}

// usesCgo reports whether Go's build info says the binary was built with cgo.
func usesCgo(path string) bool {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return true
	}
	for _, s := range bi.Settings {
		if s.Key == "CGO_ENABLED" {
			return s.Value == "1"
		}
	}
	return true
}

// moduleVersion is the binary's main module and version, and the ollama
// module it compiled llama.cpp from, from Go's build info.
func moduleVersion(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return ""
	}
	v := bi.Main.Path + " " + bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "-ldflags" && strings.Contains(s.Value, "main.version=") {
			_, after, _ := strings.Cut(s.Value, "main.version=")
			v += " (" + strings.Fields(after)[0] + ")"
		}
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/ollama/ollama" {
			v += ", llama.cpp from " + d.Path + " " + d.Version
		}
	}
	return v
}
