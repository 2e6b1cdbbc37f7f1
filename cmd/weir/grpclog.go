package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/grpclog"
)

// grpc-go logs through a process-wide logger of its own (transport errors,
// a client's bad preface, xDS stream trouble), which by default writes
// plain text to stderr. grpcLogs is installed once, before anything runs
// (grpclog.SetLoggerV2 must not be called while gRPC is in use). Until
// weir serve points it at its slog logger it behaves as grpc-go's default;
// under --log-format json serve points it at the JSON logger, so that
// every line on stderr is a JSON record.
var grpcLogs = newGRPCLogRouter(os.Getenv)

func init() { grpclog.SetLoggerV2(grpcLogs) }

// grpcSeverity is a grpc-go severity: info 0, warning 1, error 2, fatal 3.
type grpcSeverity int

// grpcLogRouter is the grpclog.LoggerV2 weir installs.
type grpcLogRouter struct {
	plain grpclog.LoggerV2             // grpc-go's default, from its environment
	to    atomic.Pointer[grpcSlogSink] // when set, where lines go instead
	min   grpcSeverity                 // GRPC_GO_LOG_SEVERITY_LEVEL of the process
	verb  int                          // GRPC_GO_LOG_VERBOSITY_LEVEL
}

// grpcSlogSink is a slog logger taking grpc-go's lines of at least min.
type grpcSlogSink struct {
	log *slog.Logger
	min grpcSeverity
}

// grpcMinSeverity reads GRPC_GO_LOG_SEVERITY_LEVEL as grpc-go does: info,
// warning, or else error.
func grpcMinSeverity(v string) grpcSeverity {
	switch strings.ToLower(v) {
	case "info":
		return 0
	case "warning":
		return 1
	}
	return 2
}

// newGRPCLogRouter reads grpc-go's own variables as grpc-go does: lines
// below GRPC_GO_LOG_SEVERITY_LEVEL (default error) are dropped, V(l) is
// l <= GRPC_GO_LOG_VERBOSITY_LEVEL (default 0).
func newGRPCLogRouter(getenv func(string) string) *grpcLogRouter {
	r := &grpcLogRouter{min: grpcMinSeverity(getenv("GRPC_GO_LOG_SEVERITY_LEVEL"))}
	if v, err := strconv.Atoi(getenv("GRPC_GO_LOG_VERBOSITY_LEVEL")); err == nil {
		r.verb = v
	}
	w := func(s grpcSeverity) io.Writer {
		if s >= r.min {
			return os.Stderr
		}
		return io.Discard
	}
	r.plain = grpclog.NewLoggerV2WithVerbosity(w(0), w(1), w(2), r.verb)
	return r
}

// toSlog sends grpc-go's lines to log from now on, those at least as
// severe as lookup's GRPC_GO_LOG_SEVERITY_LEVEL; the returned function
// undoes it (if no later call replaced log).
func (r *grpcLogRouter) toSlog(log *slog.Logger, lookup func(string) (string, bool)) (restore func()) {
	v, _ := lookup("GRPC_GO_LOG_SEVERITY_LEVEL")
	s := &grpcSlogSink{log: log, min: grpcMinSeverity(v)}
	r.to.Store(s)
	return func() { r.to.CompareAndSwap(s, nil) }
}

func (r *grpcLogRouter) emit(sev grpcSeverity, msg string) bool {
	s := r.to.Load()
	if s == nil {
		return false
	}
	if sev < s.min {
		return true
	}
	lv := slog.LevelError
	switch sev {
	case 0:
		lv = slog.LevelInfo
	case 1:
		lv = slog.LevelWarn
	}
	s.log.Log(context.Background(), lv, strings.TrimRight(msg, "\n"), "source", "grpc-go")
	return true
}

func (r *grpcLogRouter) Info(args ...any) {
	if !r.emit(0, fmt.Sprint(args...)) {
		r.plain.Info(args...)
	}
}

func (r *grpcLogRouter) Infoln(args ...any) {
	if !r.emit(0, fmt.Sprintln(args...)) {
		r.plain.Infoln(args...)
	}
}

func (r *grpcLogRouter) Infof(format string, args ...any) {
	if !r.emit(0, fmt.Sprintf(format, args...)) {
		r.plain.Infof(format, args...)
	}
}

func (r *grpcLogRouter) Warning(args ...any) {
	if !r.emit(1, fmt.Sprint(args...)) {
		r.plain.Warning(args...)
	}
}

func (r *grpcLogRouter) Warningln(args ...any) {
	if !r.emit(1, fmt.Sprintln(args...)) {
		r.plain.Warningln(args...)
	}
}

func (r *grpcLogRouter) Warningf(format string, args ...any) {
	if !r.emit(1, fmt.Sprintf(format, args...)) {
		r.plain.Warningf(format, args...)
	}
}

func (r *grpcLogRouter) Error(args ...any) {
	if !r.emit(2, fmt.Sprint(args...)) {
		r.plain.Error(args...)
	}
}

func (r *grpcLogRouter) Errorln(args ...any) {
	if !r.emit(2, fmt.Sprintln(args...)) {
		r.plain.Errorln(args...)
	}
}

func (r *grpcLogRouter) Errorf(format string, args ...any) {
	if !r.emit(2, fmt.Sprintf(format, args...)) {
		r.plain.Errorf(format, args...)
	}
}

// Fatal logs and exits, as grpc-go expects of a LoggerV2.
func (r *grpcLogRouter) Fatal(args ...any) {
	if r.emit(3, fmt.Sprint(args...)) {
		os.Exit(1)
	}
	r.plain.Fatal(args...)
}

// Fatalln logs and exits.
func (r *grpcLogRouter) Fatalln(args ...any) {
	if r.emit(3, fmt.Sprintln(args...)) {
		os.Exit(1)
	}
	r.plain.Fatalln(args...)
}

// Fatalf logs and exits.
func (r *grpcLogRouter) Fatalf(format string, args ...any) {
	if r.emit(3, fmt.Sprintf(format, args...)) {
		os.Exit(1)
	}
	r.plain.Fatalf(format, args...)
}

// V reports whether verbosity level l is on.
func (r *grpcLogRouter) V(l int) bool { return l <= r.verb }
