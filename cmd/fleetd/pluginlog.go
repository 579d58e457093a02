package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// pluginLogger is the hclog logger the plugin manager and go-plugin use. It
// writes nothing itself: every line, the manager's and the plugins' own
// (go-plugin re-logs a plugin's stderr through it), goes to the daemon's
// slog logger, so plugin lines take serve's format (-log-json) and level.
func pluginLogger(log *slog.Logger, level string) hclog.Logger {
	il := hclog.NewInterceptLogger(&hclog.LoggerOptions{
		Name:   "plugins",
		Level:  hclog.LevelFromString(level),
		Output: io.Discard,
	})
	il.RegisterSink(slogSink{log})
	return il
}

// slogSink forwards hclog lines to slog.
type slogSink struct{ log *slog.Logger }

func (s slogSink) Accept(name string, level hclog.Level, msg string, args ...any) {
	s.log.Log(context.Background(), slogLevel(level), msg, append([]any{"logger", name}, args...)...)
}

func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}
