package cudallama

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A plugin may carry several builds of the ggml CUDA backend, one per CUDA
// toolkit or GPU generation (make cuda CUDA_VARIANT=NAME), each a directory
// LIBDIR/cuda/NAME holding libggml-cuda.so, libggml-base.so.0, the version
// stamp and CUDABuildFile; a library directly in LIBDIR (make cuda without a
// variant) is one more build. The plugin asks the CUDA driver for the GPUs'
// compute capabilities before it loads any of them, and loads the one build
// that runs on every GPU.
const (
	CUDABuildsDir = "cuda"             // LIBDIR/cuda/NAME: the builds
	CUDABuildFile = "hydra-cuda.build" // "cuda 11.8\narchs 60-real;…;90\n", written by make cuda
)

// cudaArch is one entry of a build's CMake CUDA_ARCHITECTURES: "86" is SASS
// and PTX for sm_86, "86-real" SASS only, "90-virtual" PTX only, and an "a"
// or "f" suffix ("90a") code for that exact architecture alone.
type cudaArch struct {
	sm        int // 86
	sass, ptx bool
	specific  bool // "a"/"f": runs only on exactly this compute capability
}

// parseCUDAArch parses one CMake CUDA architecture.
func parseCUDAArch(s string) (cudaArch, error) {
	a := cudaArch{sass: true, ptx: true}
	switch {
	case strings.HasSuffix(s, "-real"):
		s, a.ptx = strings.TrimSuffix(s, "-real"), false
	case strings.HasSuffix(s, "-virtual"):
		s, a.sass = strings.TrimSuffix(s, "-virtual"), false
	}
	if t := strings.TrimRight(s, "af"); t != s && len(s)-len(t) == 1 {
		s, a.specific = t, true
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 10 || n > 999 {
		return cudaArch{}, fmt.Errorf("bad CUDA architecture %q", s)
	}
	a.sm = n
	return a, nil
}

// computeCap is a GPU's compute capability, 9.0 as {9, 0}.
type computeCap struct{ major, minor int }

func (c computeCap) sm() int        { return c.major*10 + c.minor }
func (c computeCap) String() string { return fmt.Sprintf("%d.%d", c.major, c.minor) }

// fit is how well a build's code runs on a GPU, worst first.
type fit int

const (
	fitNone fit = iota // no code the GPU can run
	fitPTX             // PTX the driver compiles at first load (slow start, then full speed)
	fitSASS            // machine code for the GPU's generation
)

// runsOn is how arch's code runs on a GPU of capability cc: SASS for sm_XY
// runs on X.Z for Z ≥ Y (same major), PTX for compute_XY on any capability
// ≥ XY; arch-specific code ("90a") only on exactly its own.
func (a cudaArch) runsOn(cc computeCap) fit {
	switch {
	case a.specific && a.sm != cc.sm():
		return fitNone
	case a.sass && a.sm/10 == cc.major && a.sm <= cc.sm():
		return fitSASS
	case a.ptx && a.sm <= cc.sm():
		return fitPTX
	}
	return fitNone
}

// cudaBuild is one libggml-cuda.so build and what it was compiled for.
type cudaBuild struct {
	name    string // "cuda/sm90", or LIBDIR for the library in LIBDIR itself
	dir     string
	toolkit cudaVersion
	archs   []cudaArch
	spec    string // the archs as written, for the log
}

// cudaVersion is a CUDA release, 11.8 as {11, 8}.
type cudaVersion struct{ major, minor int }

func (v cudaVersion) String() string { return fmt.Sprintf("%d.%d", v.major, v.minor) }
func (v cudaVersion) less(w cudaVersion) bool {
	return v.major < w.major || v.major == w.major && v.minor < w.minor
}

// parseCUDAVersion parses "11.8"; the driver's 12040 is parsed by the caller.
func parseCUDAVersion(s string) (cudaVersion, error) {
	maj, min, ok := strings.Cut(s, ".")
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if !ok || err1 != nil || err2 != nil || a <= 0 || b < 0 {
		return cudaVersion{}, fmt.Errorf("bad CUDA version %q", s)
	}
	return cudaVersion{a, b}, nil
}

// parseCUDABuild reads a CUDABuildFile: a "cuda" line with the toolkit
// release and an "archs" line with the CMake architectures; both required.
func parseCUDABuild(text string) (cudaVersion, []cudaArch, string, error) {
	var tk cudaVersion
	var archs []cudaArch
	var spec string
	for _, line := range strings.Split(text, "\n") {
		key, val, _ := strings.Cut(strings.TrimSpace(line), " ")
		val = strings.TrimSpace(val)
		switch key {
		case "":
		case "cuda":
			v, err := parseCUDAVersion(val)
			if err != nil {
				return tk, nil, "", err
			}
			tk = v
		case "archs":
			spec = val
			for _, s := range strings.FieldsFunc(val, func(r rune) bool { return r == ';' || r == ',' || r == ' ' }) {
				a, err := parseCUDAArch(s)
				if err != nil {
					return tk, nil, "", err
				}
				archs = append(archs, a)
			}
		default:
			return tk, nil, "", fmt.Errorf("unknown line %q", line)
		}
	}
	if tk.major == 0 || len(archs) == 0 {
		return tk, nil, "", errors.New(`needs a "cuda MAJOR.MINOR" and an "archs LIST" line`)
	}
	return tk, archs, spec, nil
}

// describe is the build for the log: "cuda/sm90 (CUDA 13.0: 90)".
func (b cudaBuild) describe() string {
	if b.toolkit.major == 0 {
		return b.name + " (architectures unknown: no " + CUDABuildFile + ")"
	}
	return fmt.Sprintf("%s (CUDA %s: %s)", b.name, b.toolkit, b.spec)
}

// fitsAll is the worst fit of b over every GPU: a build must run on all of
// them, as llama.cpp spreads the layers over every visible device.
func (b cudaBuild) fitsAll(gpus gpuInfo) fit {
	worst := fitSASS
	for _, cc := range gpus.devices {
		best := fitNone
		for _, a := range b.archs {
			best = max(best, a.runsOn(cc))
		}
		worst = min(worst, best)
	}
	return worst
}

// gpuInfo is what the CUDA driver says before any library is loaded: the
// CUDA release it supports and each visible GPU's compute capability.
type gpuInfo struct {
	driver  cudaVersion
	devices []computeCap
	names   []string
}

// describe is the GPUs for the log: "NVIDIA H200 (9.0), driver CUDA 13.0".
func (g gpuInfo) describe() string {
	var ds []string
	for i, cc := range g.devices {
		name := "GPU " + strconv.Itoa(i)
		if i < len(g.names) && g.names[i] != "" {
			name = g.names[i]
		}
		ds = append(ds, fmt.Sprintf("%s (compute capability %s)", name, cc))
	}
	return strings.Join(ds, ", ") + ", driver CUDA " + g.driver.String()
}

// errNoCUDABuildFits: CUDA builds are present, but none runs on the GPUs.
var errNoCUDABuildFits = errors.New("no CUDA build fits")

// findCUDABuilds lists the builds in dir: dir itself when it holds
// CUDALibrary, and each dir/cuda/NAME that does. A build whose version stamp
// is wrong or whose CUDABuildFile is unreadable is left out, with the reason
// in problems; one without a CUDABuildFile is kept with unknown architectures.
func findCUDABuilds(dir string) (builds []cudaBuild, problems []error) {
	dirs := []string{dir}
	if subs, err := os.ReadDir(filepath.Join(dir, CUDABuildsDir)); err == nil {
		for _, s := range subs {
			if s.IsDir() {
				dirs = append(dirs, filepath.Join(dir, CUDABuildsDir, s.Name()))
			}
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, CUDALibrary)); err != nil {
			continue
		}
		name, _ := filepath.Rel(dir, d)
		if name == "." {
			name = d // the library beside the plugin (make cuda without CUDA_VARIANT)
		}
		b := cudaBuild{name: name, dir: d}
		if _, err := cudaLibrary(d); err != nil {
			problems = append(problems, fmt.Errorf("%s left out: %w", name, err))
			continue
		}
		text, err := os.ReadFile(filepath.Join(d, CUDABuildFile))
		switch {
		case errors.Is(err, os.ErrNotExist):
			builds = append(builds, b) // an older make cuda: loaded only where no described build fits
			continue
		case err != nil:
			problems = append(problems, fmt.Errorf("%s left out: %w", name, err))
			continue
		}
		if b.toolkit, b.archs, b.spec, err = parseCUDABuild(string(text)); err != nil {
			problems = append(problems, fmt.Errorf("%s left out: %s: %w", name, filepath.Join(d, CUDABuildFile), err))
			continue
		}
		builds = append(builds, b)
	}
	return builds, problems
}

// chooseCUDABuild picks the build to load for gpus: one that runs on every
// GPU with a toolkit the driver supports (a CUDA 13 runtime needs a CUDA 13
// driver; PTX also needs a driver at least as new as the toolkit that wrote
// it), machine code before PTX, then the newest toolkit, then the fewest
// architectures (the smaller library), then the name. A build whose
// architectures are unknown is the last resort. The note says why, for the
// log; with nothing that fits, errNoCUDABuildFits names the GPUs and every
// build.
func chooseCUDABuild(builds []cudaBuild, gpus gpuInfo) (cudaBuild, string, error) {
	type candidate struct {
		b   cudaBuild
		fit fit
	}
	var cands []candidate
	var unknown []cudaBuild
	var refused []string
	for _, b := range builds {
		if b.toolkit.major == 0 {
			unknown = append(unknown, b)
			continue
		}
		if b.toolkit.major > gpus.driver.major {
			refused = append(refused, fmt.Sprintf("%s needs a CUDA %d driver", b.describe(), b.toolkit.major))
			continue
		}
		f := b.fitsAll(gpus)
		if f == fitPTX && gpus.driver.less(b.toolkit) {
			f = fitNone // PTX newer than the driver's compiler
		}
		if f == fitNone {
			refused = append(refused, b.describe()+" has no code for it")
			continue
		}
		cands = append(cands, candidate{b, f})
	}
	slices.SortFunc(cands, func(x, y candidate) int {
		if x.fit != y.fit {
			return cmp.Compare(y.fit, x.fit)
		}
		if x.b.toolkit != y.b.toolkit {
			if y.b.toolkit.less(x.b.toolkit) {
				return -1
			}
			return 1
		}
		if len(x.b.archs) != len(y.b.archs) {
			return cmp.Compare(len(x.b.archs), len(y.b.archs))
		}
		return strings.Compare(x.b.name, y.b.name)
	})
	switch {
	case len(cands) > 0:
		c := cands[0]
		note := "machine code for its compute capability"
		if c.fit == fitPTX {
			note = "no build has machine code for it: the driver compiles this build's PTX at first load, which takes minutes"
		}
		if len(cands)+len(refused)+len(unknown) > 1 {
			var others []string
			for _, o := range cands[1:] {
				others = append(others, o.b.describe())
			}
			others = append(others, refused...)
			for _, u := range unknown {
				others = append(others, u.describe())
			}
			note += "; also present: " + strings.Join(others, "; ")
		}
		return c.b, note, nil
	case len(unknown) > 0:
		slices.SortFunc(unknown, func(x, y cudaBuild) int { return strings.Compare(x.name, y.name) })
		note := "no described build fits, trying one whose architectures are unknown (rebuild it with make cuda, which describes it)"
		if len(refused) > 0 {
			note += "; " + strings.Join(refused, "; ")
		}
		return unknown[0], note, nil
	}
	return cudaBuild{}, "", fmt.Errorf("%w %s; builds present: %s", errNoCUDABuildFits, gpus.describe(), strings.Join(refused, "; "))
}

// selectCUDALibrary is the libggml-cuda.so in dir (or beside the executable
// when dir is empty) to load for the GPUs that query reports, and why:
// errNoCUDALibrary when there is no build at all (query is not called), the
// query's error when it finds no GPU, errNoCUDABuildFits when no build runs
// on them. problems are builds left out (wrong version stamp, bad
// description), for the log.
func selectCUDALibrary(dir string, query func() (gpuInfo, error)) (lib, note string, problems []error, err error) {
	dir = libDirOrExe(dir)
	builds, problems := findCUDABuilds(dir)
	if len(builds) == 0 {
		if len(problems) > 0 {
			return "", "", problems, fmt.Errorf("%w usable in %s", errNoCUDALibrary, dir)
		}
		return "", "", nil, fmt.Errorf("%w in %s or %s", errNoCUDALibrary, dir, filepath.Join(dir, CUDABuildsDir, "*"))
	}
	gpus, err := query()
	if err != nil {
		return "", "", problems, err
	}
	b, note, err := chooseCUDABuild(builds, gpus)
	if err != nil {
		return "", "", problems, err
	}
	return filepath.Join(b.dir, CUDALibrary), b.describe() + " for " + gpus.describe() + ": " + note, problems, nil
}

// libDirOrExe is dir, or the executable's directory when dir is empty.
func libDirOrExe(dir string) string {
	if dir != "" {
		return dir
	}
	exe, err := os.Executable()
	if err != nil {
		return "."
	}
	return filepath.Dir(exe)
}
