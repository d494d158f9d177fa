package pluginproc

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// features is the set of every feature of the levels up to top.
func features(top CPULevel) X86Features {
	f := X86Features{}
	for l := LevelV2; l <= top; l++ {
		for _, n := range levelFeatures[l] {
			f[n] = true
		}
	}
	return f
}

// without is f less names.
func without(f X86Features, names ...string) X86Features {
	g := X86Features{}
	for k, v := range f {
		g[k] = v && !slices.Contains(names, k)
	}
	return g
}

func TestClassifyCPU(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       X86Features
		level   CPULevel
		missing []string
	}{
		{"nothing", X86Features{}, LevelV1, levelFeatures[LevelV2]},
		{"v2", features(LevelV2), LevelV2, levelFeatures[LevelV3]},
		{"v3", features(LevelV3), LevelV3, levelFeatures[LevelV4]},
		{"v4", features(LevelV4), LevelV4, nil},
		{"v4 less AVX512VL", without(features(LevelV4), "AVX512VL"), LevelV3, []string{"AVX512VL"}},
		{"v4 less AVX512BW and DQ", without(features(LevelV4), "AVX512BW", "AVX512DQ"), LevelV3, []string{"AVX512BW", "AVX512DQ"}},
		// AVX without OS support for the YMM state: x/sys/cpu clears HasAVX.
		{"v3 less OSXSAVE", without(features(LevelV3), "OSXSAVE"), LevelV2, []string{"OSXSAVE"}},
		{"v3 less MOVBE", without(features(LevelV3), "MOVBE"), LevelV2, []string{"MOVBE"}},
		{"v3 less F16C and LZCNT", without(features(LevelV3), "F16C", "LZCNT"), LevelV2, []string{"F16C", "LZCNT"}},
		// Levels stack: AVX-512 without SSE4.2 is still the baseline.
		{"v4 less SSE42", without(features(LevelV4), "SSE42"), LevelV1, []string{"SSE42"}},
		{"v2 less CX16 and LAHF", without(features(LevelV2), "CX16", "LAHF"), LevelV1, []string{"CX16", "LAHF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ClassifyCPU(tc.f)
			if c.Level != tc.level || !slices.Equal(c.Missing, tc.missing) {
				t.Fatalf("level %s missing %v, want %s missing %v", c.Level, c.Missing, tc.level, tc.missing)
			}
		})
	}
}

func TestCPULevelNames(t *testing.T) {
	want := map[CPULevel]string{LevelUnknown: "unknown", LevelV1: "x86-64", LevelV2: "x86-64-v2", LevelV3: "x86-64-v3", LevelV4: "x86-64-v4"}
	for l, s := range want {
		if l.String() != s {
			t.Errorf("%d: %q, want %q", l, l.String(), s)
		}
	}
	if c := DetectCPU(); c.Level == LevelUnknown {
		t.Logf("this CPU has no x86-64 level")
	} else {
		t.Logf("this CPU: %s", c.describe())
	}
}

// plugins writes executables hydra-plugin-p and hydra-plugin-p.SUFFIX for
// each suffix into a new directory (a suffix ending in "!" is written
// without the executable bit).
func plugins(t *testing.T, suffixes ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, s := range suffixes {
		mode := os.FileMode(0o755)
		if strings.HasSuffix(s, "!") {
			s, mode = strings.TrimSuffix(s, "!"), 0o644
		}
		name := "hydra-plugin-p"
		if s != "" {
			name += "." + s
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestResolveVariant(t *testing.T) {
	all := []string{"", "x86-64-v2", "x86-64-v3", "x86-64-v4"}
	for _, tc := range []struct {
		name    string
		files   []string
		host    CPULevel
		file    string // what runs: the baseline is "hydra-plugin-p"
		variant string
		why     string // a part of VariantWhy
	}{
		{"v4 CPU, all present: v4", all, LevelV4, "hydra-plugin-p.x86-64-v4", "x86-64-v4", "the CPU's own level"},
		{"v3 CPU, all present: v3", all, LevelV3, "hydra-plugin-p.x86-64-v3", "x86-64-v3", "variants present: x86-64-v4, x86-64-v3, x86-64-v2"},
		{"v2 CPU, all present: v2", all, LevelV2, "hydra-plugin-p.x86-64-v2", "x86-64-v2", "the CPU's own level"},
		{"baseline CPU, all present: baseline", all, LevelV1, "hydra-plugin-p", "x86-64", "none at or below the CPU's level"},
		{"v4 CPU, v4 missing: v3", []string{"", "x86-64-v2", "x86-64-v3"}, LevelV4, "hydra-plugin-p.x86-64-v3", "x86-64-v3", "none for x86-64-v4: the next lower one"},
		{"v4 CPU, only v2: v2", []string{"", "x86-64-v2"}, LevelV4, "hydra-plugin-p.x86-64-v2", "x86-64-v2", "the next lower one"},
		{"v2 CPU, only v3 and v4: baseline", []string{"", "x86-64-v3", "x86-64-v4"}, LevelV2, "hydra-plugin-p", "x86-64", "none at or below"},
		{"v4 CPU, v4 not executable: v3", []string{"", "x86-64-v3", "x86-64-v4!"}, LevelV4, "hydra-plugin-p.x86-64-v3", "x86-64-v3", "hydra-plugin-p.x86-64-v4 is not an executable file"},
		{"not x86-64: baseline", all, LevelUnknown, "hydra-plugin-p", "x86-64", "not an x86-64 CPU"},
		{"baseline only: nothing to choose", []string{""}, LevelV4, "hydra-plugin-p", "", ""},
		{"an unknown suffix is no variant", []string{"", "x86-64-v5", "avx2"}, LevelV4, "hydra-plugin-p", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := plugins(t, tc.files...)
			host := HostCPU{Level: tc.host}
			spec, err := resolvePlugin("p", dir, host)
			if err != nil {
				t.Fatal(err)
			}
			if spec.Path != filepath.Join(dir, tc.file) || spec.Variant != tc.variant || !strings.Contains(spec.VariantWhy, tc.why) {
				t.Fatalf("path %s variant %q why %q; want %s, %q, %q", spec.Path, spec.Variant, spec.VariantWhy, tc.file, tc.variant, tc.why)
			}
			if spec.Name != "p" || len(spec.Args) != 0 {
				t.Fatalf("spec %+v", spec)
			}
		})
	}
}

func TestResolveVariantNeedsBaseline(t *testing.T) {
	// Variants name no plugin by themselves: the baseline always exists.
	dir := plugins(t, "x86-64-v3")
	if _, err := resolvePlugin("p", dir, HostCPU{Level: LevelV4}); err == nil || !strings.Contains(err.Error(), "no executable hydra-plugin-p") {
		t.Fatalf("only a variant: %v", err)
	}
}

func TestResolvePathRunsAsNamed(t *testing.T) {
	// A path is one file: no variant replaces it (the way to run a level by hand).
	dir := plugins(t, "", "x86-64-v3")
	for _, f := range []string{"hydra-plugin-p", "hydra-plugin-p.x86-64-v3"} {
		spec, err := resolvePlugin(filepath.Join(dir, f), "", HostCPU{Level: LevelV4})
		if err != nil || spec.Path != filepath.Join(dir, f) || spec.Variant != "" {
			t.Fatalf("%s: %+v, %v", f, spec, err)
		}
	}
}

func TestResolveNoBackend(t *testing.T) {
	if _, err := resolvePlugin("", t.TempDir(), HostCPU{Level: LevelV4}); err == nil || err.Error() != "no backend given" {
		t.Fatalf("no backend: %v", err)
	}
}
