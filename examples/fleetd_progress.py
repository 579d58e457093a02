"""fleetd progress reports: a tiny, dependency-free helper (Python 3.6+, stdlib only).

fleetd's agent sets FLEETD_PROGRESS to a file for each round; global rank 0
appends one JSON object per line to it and the agent forwards the latest with
its heartbeats. The daemon turns them into throughput per fleet size (what its
autoscaler sizes the fleet by), an ETA, and the progress shown by `fleetd
status`, the dashboard and /metrics. The contract (docs/agent.md, "Progress
reports") is just that line:

    {"step": 1200, "samples": 76800, "loss": 0.231, "total_steps": 5000, "time": 1767000000.5}

`step` (optimizer steps of the whole job) is required; `samples` (or tokens,
any unit used consistently; default: the step), `loss`, `total_steps` and
`time` (Unix seconds the step finished; default: when the agent read it) are
optional. Without FLEETD_PROGRESS (not under fleetd, or an older agent) and on
every rank but 0 the helper does nothing, so a script can call it
unconditionally:

    from fleetd_progress import Reporter
    progress = Reporter(total_steps=args.steps)
    progress.report(step, samples=step * global_batch)          # once, at the start or resume point
    for ...:
        train_step()
        progress.report(step, samples=step * global_batch, loss=loss)  # at most every `every` seconds

Copy this file next to your script, or put its directory on sys.path.
"""

import json
import math
import os
import sys
import time

ENV = "FLEETD_PROGRESS"

__all__ = ["Reporter", "report", "ENV"]


class Reporter(object):
    """Appends progress reports to $FLEETD_PROGRESS on global rank 0.

    every: the least number of seconds between two written reports (the
    first report, the last step of the run and force=True always write).
    """

    def __init__(self, total_steps=None, every=1.0, path=None, rank=None):
        self.path = os.environ.get(ENV, "") if path is None else path
        if rank is None:
            try:
                rank = int(os.environ.get("RANK", "0") or 0)
            except ValueError:
                rank = 0
        self.enabled = bool(self.path) and rank == 0
        self.total_steps = total_steps
        self.every = max(0.0, float(every))
        self._last = None  # monotonic time of the last written report
        self._file = None
        self._warned = False

    def report(self, step, samples=None, loss=None, total_steps=None, force=False, batch=None, noise_scale=None):
        """Report that `step` optimizer steps (and `samples` samples) of the whole
        job are done. Returns True when a line was written. `batch` (the global
        batch) and `noise_scale` (the gradient noise scale, e.g.
        fleetd_elastic.AdaptiveBatch.progress_fields()) let fleetd's allocator
        weigh each size by the statistical efficiency of its batch."""
        if not self.enabled:
            return False
        now = time.monotonic()
        total = self.total_steps if total_steps is None else total_steps
        last_step = total is not None and step >= total
        if not force and not last_step and self._last is not None and now - self._last < self.every:
            return False
        rec = {"step": int(step), "time": round(time.time(), 3)}
        if samples is not None:
            rec["samples"] = _number(samples)
        if loss is not None:
            loss = _number(loss)
            if loss is not None:
                rec["loss"] = loss
        if total is not None:
            rec["total_steps"] = int(total)
        for key, v in (("batch", batch), ("noise_scale", noise_scale)):
            v = _number(v) if v is not None else None
            if v is not None and v >= 0:
                rec[key] = v
        try:
            if self._file is None:
                self._file = open(self.path, "a")
            self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")
            self._file.flush()
        except (OSError, ValueError) as e:
            if not self._warned:
                self._warned = True
                sys.stderr.write("fleetd_progress: cannot write %s: %s (progress reports off)\n" % (self.path, e))
            self.enabled = False
            return False
        self._last = now
        return True

    def close(self):
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


def _number(v):
    """A float for JSON, or None for what JSON cannot hold (NaN, inf)."""
    try:
        v = float(v.item() if hasattr(v, "item") else v)
    except (TypeError, ValueError):
        return None
    if math.isnan(v) or math.isinf(v):
        return None
    return int(v) if v.is_integer() and abs(v) < 2 ** 53 else v


_default = None


def report(step, samples=None, loss=None, total_steps=None, force=False, batch=None, noise_scale=None):
    """Module-level shortcut with a default Reporter (every=1s)."""
    global _default
    if _default is None:
        _default = Reporter()
    return _default.report(step, samples=samples, loss=loss, total_steps=total_steps, force=force, batch=batch,
                           noise_scale=noise_scale)
