package cudallama

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The packaged set (deploy/CUDA.md): Pascal to Hopper with CUDA 11.8, sm_90
// and sm_120 with CUDA 13.
var packaged = map[string]string{
	"sm60-90": "cuda 11.8\narchs 60-real;61-real;70-real;75-real;80-real;86-real;89-real;90\n",
	"sm90":    "cuda 13.0\narchs 90\n",
	"sm120":   "cuda 13.0\narchs 120\n",
}

// writeBuild writes a fake build into dir (a library, the version stamp
// stamp, and desc as CUDABuildFile unless it is empty).
func writeBuild(t *testing.T, dir, stamp, desc string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{CUDALibrary: "ELF", VersionStampFile: stamp + "\n"}
	if desc != "" {
		files[CUDABuildFile] = desc
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// libDir is a plugin directory holding the given builds under cuda/.
func libDir(t *testing.T, builds map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, desc := range builds {
		writeBuild(t, filepath.Join(dir, CUDABuildsDir, name), versionStamp(llamaCommit), desc)
	}
	return dir
}

// gpus fakes what the CUDA driver reports.
func gpus(driver string, caps ...string) func() (gpuInfo, error) {
	return func() (gpuInfo, error) {
		v, err := parseCUDAVersion(driver)
		if err != nil {
			return gpuInfo{}, err
		}
		g := gpuInfo{driver: v}
		for _, c := range caps {
			cc, err := parseCUDAVersion(c)
			if err != nil {
				return gpuInfo{}, err
			}
			g.devices = append(g.devices, computeCap(cc))
		}
		return g, nil
	}
}

func TestSelectCUDABuild(t *testing.T) {
	dir := libDir(t, packaged)
	for _, tc := range []struct {
		name   string
		query  func() (gpuInfo, error)
		build  string // "" = none fits
		inNote string
	}{
		{"P100 6.0", gpus("12.4", "6.0"), "sm60-90", "machine code for its compute capability"},
		{"GTX 1080 6.1", gpus("13.0", "6.1"), "sm60-90", "machine code for its compute capability"},
		{"V100 7.0", gpus("12.2", "7.0"), "sm60-90", "machine code for its compute capability"},
		{"RTX 3090 8.6", gpus("13.0", "8.6"), "sm60-90", "also present"},
		{"RTX 4090 8.9", gpus("13.0", "8.9"), "sm60-90", "machine code for its compute capability"},
		{"H200 9.0: CUDA 13's sm_90 before CUDA 11.8's", gpus("13.0", "9.0"), "sm90", "also present: cuda/sm60-90 (CUDA 11.8"},
		{"H100 9.0 on a CUDA 12 driver", gpus("12.4", "9.0"), "sm60-90", "cuda/sm90 (CUDA 13.0: 90) needs a CUDA 13 driver"},
		{"RTX 5090 12.0", gpus("13.0", "12.0"), "sm120", "machine code for its compute capability"},
		{"GB10 12.1: sm_120 code runs on 12.x", gpus("13.0", "12.1"), "sm120", "machine code for its compute capability"},
		{"RTX 5090 12.0 on a CUDA 12.8 driver: 11.8's PTX", gpus("12.8", "12.0"), "sm60-90", "PTX"},
		{"B200 10.0: sm_90's PTX", gpus("13.0", "10.0"), "sm90", "PTX"},
		{"P100 and H200 in one box: the build that runs on both", gpus("13.0", "6.0", "9.0"), "sm60-90", "machine code for its compute capability"},
		{"Maxwell 5.2: none", gpus("12.4", "5.2"), "", ""},
		{"K80 3.7: none", gpus("11.4", "3.7"), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lib, note, problems, err := selectCUDALibrary(dir, tc.query)
			if len(problems) > 0 {
				t.Fatalf("problems: %v", problems)
			}
			if tc.build == "" {
				if !errors.Is(err, errNoCUDABuildFits) {
					t.Fatalf("chose %s (%s), want errNoCUDABuildFits", lib, note)
				}
				g, _ := tc.query()
				for _, want := range []string{"compute capability " + g.devices[0].String(), "cuda/sm60-90 (CUDA 11.8", "cuda/sm90 (CUDA 13.0: 90)", "cuda/sm120 (CUDA 13.0: 120)"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not name %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(dir, CUDABuildsDir, tc.build, CUDALibrary); lib != want || !strings.Contains(note, tc.inNote) {
				t.Fatalf("chose %s (%s), want %s with %q", lib, note, want, tc.inNote)
			}
			t.Logf("%s: %s", tc.name, note)
		})
	}
}

func TestSelectCUDABuildFlat(t *testing.T) {
	// make cuda without CUDA_VARIANT: the library beside the plugin is a build too.
	dir := t.TempDir()
	writeBuild(t, dir, versionStamp(llamaCommit), "cuda 13.0\narchs 90\n")
	lib, _, _, err := selectCUDALibrary(dir, gpus("13.0", "9.0"))
	if err != nil || lib != filepath.Join(dir, CUDALibrary) {
		t.Fatalf("%s, %v", lib, err)
	}
	if _, _, _, err := selectCUDALibrary(dir, gpus("13.0", "8.6")); !errors.Is(err, errNoCUDABuildFits) || !strings.Contains(err.Error(), dir+" (CUDA 13.0: 90) has no code for it") {
		t.Fatalf("8.6: %v", err)
	}
	// An older make cuda wrote no description: tried only when nothing described fits.
	if err := os.Remove(filepath.Join(dir, CUDABuildFile)); err != nil {
		t.Fatal(err)
	}
	writeBuild(t, filepath.Join(dir, CUDABuildsDir, "sm120"), versionStamp(llamaCommit), "cuda 13.0\narchs 120\n")
	if lib, _, _, err := selectCUDALibrary(dir, gpus("13.0", "12.0")); err != nil || lib != filepath.Join(dir, CUDABuildsDir, "sm120", CUDALibrary) {
		t.Fatalf("12.0: %s, %v", lib, err)
	}
	lib, note, _, err := selectCUDALibrary(dir, gpus("13.0", "9.0"))
	if err != nil || lib != filepath.Join(dir, CUDALibrary) || !strings.Contains(note, "architectures are unknown") {
		t.Fatalf("9.0: %s (%s), %v", lib, note, err)
	}
}

func TestSelectCUDABuildProblems(t *testing.T) {
	dir := libDir(t, map[string]string{
		"sm90":     "cuda 13.0\narchs 90\n",
		"bad-arch": "cuda 13.0\narchs 90;sm_120\n",
		"bad-tk":   "cuda thirteen\narchs 120\n",
		"no-cuda":  "archs 120\n",
		"extra":    "cuda 13.0\narchs 120\nflavour fast\n",
	})
	writeBuild(t, filepath.Join(dir, CUDABuildsDir, "old"), versionStamp("v0.0.1"), "cuda 13.0\narchs 120\n")
	if err := os.MkdirAll(filepath.Join(dir, CUDABuildsDir, "empty"), 0o755); err != nil {
		t.Fatal(err) // a directory without a library is no build
	}
	lib, _, problems, err := selectCUDALibrary(dir, gpus("13.0", "9.0"))
	if err != nil || lib != filepath.Join(dir, CUDABuildsDir, "sm90", CUDALibrary) {
		t.Fatalf("%s, %v", lib, err)
	}
	got := errors.Join(problems...).Error()
	for _, want := range []string{`cuda/bad-arch left out`, `bad CUDA architecture "sm_120"`, `cuda/bad-tk left out`, `bad CUDA version "thirteen"`,
		`cuda/no-cuda left out`, `needs a "cuda MAJOR.MINOR"`, `cuda/extra left out`, `unknown line "flavour fast"`, `cuda/old left out`, `v0.0.1`} {
		if !strings.Contains(got, want) {
			t.Errorf("problems do not say %q:\n%s", want, got)
		}
	}
	if len(problems) != 5 {
		t.Errorf("%d problems, want 5: %v", len(problems), problems)
	}
	// Only bad builds: none usable, so CPU, and the query is not needed.
	bad := libDir(t, map[string]string{"x": "cuda 13.0\narchs x\n"})
	if _, _, problems, err := selectCUDALibrary(bad, gpus("13.0", "9.0")); !errors.Is(err, errNoCUDALibrary) || len(problems) != 1 {
		t.Fatalf("only bad builds: %v, %v", err, problems)
	}
}

func TestSelectCUDABuildNoneOrNoGPU(t *testing.T) {
	asked := false
	query := func() (gpuInfo, error) { asked = true; return gpuInfo{}, errors.New("no GPU here") }
	if _, _, _, err := selectCUDALibrary(t.TempDir(), query); !errors.Is(err, errNoCUDALibrary) || asked {
		t.Fatalf("no builds: %v, driver asked %v", err, asked)
	}
	if _, _, _, err := selectCUDALibrary(libDir(t, packaged), query); err == nil || err.Error() != "no GPU here" {
		t.Fatalf("no GPU: %v", err)
	}
}

func TestParseCUDAArch(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want cudaArch
	}{
		{"90", cudaArch{sm: 90, sass: true, ptx: true}},
		{"86-real", cudaArch{sm: 86, sass: true}},
		{"75-virtual", cudaArch{sm: 75, ptx: true}},
		{"90a", cudaArch{sm: 90, sass: true, ptx: true, specific: true}},
		{"120f-real", cudaArch{sm: 120, sass: true, specific: true}},
	} {
		if got, err := parseCUDAArch(tc.in); err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "sm_90", "9", "90aa", "90-fake", "1200", "native"} {
		if a, err := parseCUDAArch(bad); err == nil {
			t.Errorf("%q: %+v, no error", bad, a)
		}
	}
}

func TestCUDAArchRunsOn(t *testing.T) {
	for _, tc := range []struct {
		arch string
		cc   computeCap
		want fit
	}{
		{"80-real", computeCap{8, 6}, fitSASS}, // same major, newer minor
		{"86-real", computeCap{8, 0}, fitNone}, // older minor
		{"86", computeCap{8, 0}, fitNone},      // PTX only forward
		{"90", computeCap{12, 0}, fitPTX},      // other major: PTX
		{"90-real", computeCap{12, 0}, fitNone},
		{"90a", computeCap{9, 0}, fitSASS},
		{"90a", computeCap{10, 0}, fitNone}, // arch-specific code runs on its own capability only
		{"120", computeCap{12, 1}, fitSASS},
		{"75-virtual", computeCap{7, 5}, fitPTX},
	} {
		a, err := parseCUDAArch(tc.arch)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.runsOn(tc.cc); got != tc.want {
			t.Errorf("%s on %s: %d, want %d", tc.arch, tc.cc, got, tc.want)
		}
	}
}
