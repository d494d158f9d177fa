//go:build llama && cgo

package llama

import (
	"strings"
	"sync"
)

// ggml's log levels, as Log and the function SetLog sets receive them.
const (
	LogDebug = 1
	LogInfo  = 2
	LogWarn  = 3
	LogError = 4
	LogCont  = 5 // the previous line goes on, at its level
)

// Logs: llama.cpp and ggml log through one callback (shim.cpp, exports.go),
// often a line in several pieces; lines are assembled here and handed to the
// function SetLog set. Error lines are also kept: llama.cpp reports most
// failures only in its log.
var llamaLog struct {
	sync.Mutex
	log    func(level int, msg string)
	line   strings.Builder
	level  int
	errors []string // since the last LastError
}

const maxKeptErrors = 3

// SetLog makes f receive llama.cpp's and ggml's log, a whole line (trimmed,
// never empty) at a time, because they write lines in pieces; nil drops it.
func SetLog(f func(level int, msg string)) {
	llamaLog.Lock()
	llamaLog.log = f
	llamaLog.Unlock()
}

// Log writes text to the log as llama.cpp's own pieces go (a line ends at
// "\n"), so that the plugin's notes on llama.cpp's work read among its lines.
func Log(level int, text string) {
	l := &llamaLog
	l.Lock()
	defer l.Unlock()
	if level != LogCont {
		l.level = level
	}
	for text != "" {
		i := strings.IndexByte(text, '\n')
		if i < 0 {
			l.line.WriteString(text)
			return
		}
		l.line.WriteString(text[:i])
		text = text[i+1:]
		msg := strings.TrimSpace(l.line.String())
		l.line.Reset()
		if msg == "" {
			continue
		}
		if l.level == LogError && len(l.errors) < maxKeptErrors {
			l.errors = append(l.errors, msg)
		}
		if l.log != nil {
			l.log(l.level, msg)
		}
	}
}

// LastError returns ": " and the first error lines llama.cpp logged since the
// last call (or ClearError), or "", because llama.cpp says why it failed only
// in its log.
func LastError() string {
	llamaLog.Lock()
	defer llamaLog.Unlock()
	e := llamaLog.errors
	llamaLog.errors = nil
	if len(e) == 0 {
		return ""
	}
	return ": " + strings.Join(e, "; ")
}

// ClearError forgets the error lines logged so far, before a call whose
// failure LastError is to explain.
func ClearError() { _ = LastError() }
