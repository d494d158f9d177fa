package pluginproc

import (
	"runtime"
	"strings"

	"golang.org/x/sys/cpu"
)

// CPULevel is an x86-64 micro-architecture level of the x86-64 psABI, the
// levels GCC's -march=x86-64-vN and GOAMD64=vN compile for.
type CPULevel int

// The levels in order: each needs every feature of the ones below it.
const (
	LevelUnknown CPULevel = iota // not an x86-64 CPU: no variants apply
	LevelV1                      // x86-64: every amd64 CPU, the baseline build
	LevelV2                      // x86-64-v2: SSE4.2, POPCNT (Nehalem, 2008)
	LevelV3                      // x86-64-v3: AVX2, FMA, F16C (Haswell, Zen 1)
	LevelV4                      // x86-64-v4: AVX-512 F/BW/CD/DQ/VL (Skylake-SP, Zen 4)
)

// String is the level's name as GCC's -march and the variant files spell it.
func (l CPULevel) String() string {
	switch l {
	case LevelV1:
		return "x86-64"
	case LevelV2:
		return "x86-64-v2"
	case LevelV3:
		return "x86-64-v3"
	case LevelV4:
		return "x86-64-v4"
	}
	return "unknown"
}

// levelFeatures are the CPUID features each level adds to the one below it,
// exactly as the psABI lists them (the names of golang.org/x/sys/cpu's X86
// fields, whose AVX and AVX-512 bits also require the OS to save the
// registers).
var levelFeatures = map[CPULevel][]string{
	LevelV2: {"CX16", "LAHF", "POPCNT", "SSE3", "SSSE3", "SSE41", "SSE42"},
	LevelV3: {"AVX", "AVX2", "BMI1", "BMI2", "F16C", "FMA", "LZCNT", "MOVBE", "OSXSAVE"},
	LevelV4: {"AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512VL"},
}

// X86Features is a set of CPU features by the names levelFeatures uses.
type X86Features map[string]bool

// HostCPU is a CPU's level and, below x86-64-v4, the features of the next
// level it lacks (for the log).
type HostCPU struct {
	Level   CPULevel
	Missing []string // the next level's features this CPU lacks
}

// DetectCPU reads this machine's features (golang.org/x/sys/cpu, CPUID and
// XGETBV); on any other architecture the level is LevelUnknown.
func DetectCPU() HostCPU {
	if runtime.GOARCH != "amd64" {
		return HostCPU{Level: LevelUnknown}
	}
	x := &cpu.X86
	return ClassifyCPU(X86Features{
		"CX16": x.HasCX16, "LAHF": x.HasLAHF, "POPCNT": x.HasPOPCNT, "SSE3": x.HasSSE3,
		"SSSE3": x.HasSSSE3, "SSE41": x.HasSSE41, "SSE42": x.HasSSE42,
		"AVX": x.HasAVX, "AVX2": x.HasAVX2, "BMI1": x.HasBMI1, "BMI2": x.HasBMI2,
		"F16C": x.HasF16C, "FMA": x.HasFMA, "LZCNT": x.HasLZCNT, "MOVBE": x.HasMOVBE,
		"OSXSAVE": x.HasOSXSAVE,
		"AVX512F": x.HasAVX512F, "AVX512BW": x.HasAVX512BW, "AVX512CD": x.HasAVX512CD,
		"AVX512DQ": x.HasAVX512DQ, "AVX512VL": x.HasAVX512VL,
	})
}

// ClassifyCPU is the highest level all of whose features (and those of the
// levels below it) f has; a level is reached only through the ones below,
// so a CPU with AVX-512 but without SSE4.2 is x86-64.
func ClassifyCPU(f X86Features) HostCPU {
	c := HostCPU{Level: LevelV1}
	for next := LevelV2; next <= LevelV4; next++ {
		var missing []string
		for _, name := range levelFeatures[next] {
			if !f[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			c.Missing = missing
			return c
		}
		c.Level = next
	}
	return c
}

// describe says what the CPU is, for the log: "x86-64-v3 (x86-64-v4 needs
// AVX512F, AVX512BW)".
func (c HostCPU) describe() string {
	if len(c.Missing) == 0 {
		return c.Level.String()
	}
	return c.Level.String() + " (" + (c.Level + 1).String() + " needs " + strings.Join(c.Missing, ", ") + ")"
}
