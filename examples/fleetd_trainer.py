"""The skeleton the example trainers share (Python 3.6+, stdlib only).

examples/trainer/train.py and examples/pytorch/ddp_train.py (and, for its
event lines, elastic_train.py) speak the same worker contract to fleetd's
agent: JSON event lines on stdout, torchelastic's error file, exit codes,
SIGTERM handling, checkpoint-on-notice files and atomic checkpoint writes.
That contract lives here once; each script puts this directory on sys.path
and imports what it uses.
"""

import json
import os
import signal
import sys
import time
import traceback

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PEER = 3

DONE_FILE = "DONE"


class UsageError(Exception):
    """Bad arguments, environment or checkpoint: retrying cannot help."""


class PeerLost(Exception):
    """The group broke: a peer closed, reset or stayed silent too long."""


# --- output -----------------------------------------------------------------

def emit(event, **fields):
    """One JSON event line on stdout, stamped with the time unless given."""
    rec = {"event": event}
    rec.update(fields)
    rec.setdefault("time", time.time())
    sys.stdout.write(json.dumps(rec, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def write_error_file(exc):
    """The JSON torchelastic's @record writes, so torchrun (and fleetd's
    agent) can report the root cause of a non-zero exit."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    body = {"message": {
        "message": "%s: %s" % (type(exc).__name__, exc),
        "extraInfo": {"py_callstack": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                      "timestamp": str(int(time.time()))},
    }}
    try:
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            json.dump(body, f)
    except OSError:
        pass  # best effort: the exit code still tells the story


def hard_exit(code):
    """Leave without running destructors: a process group whose peer is gone
    can block in teardown, and the agent wants a prompt exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# --- signals ----------------------------------------------------------------

class StopFlag:
    """Remembers the first SIGTERM/SIGINT; the training loop polls it."""

    def __init__(self):
        self.signal = None

    def install(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal = signal.Signals(signum).name

    @property
    def set(self):
        return self.signal is not None


def await_own_signal(stop, grace):
    """The group broke because a peer stopped or died. If our own SIGTERM is
    on its way (the agent stops every worker), exit 0 like the others;
    otherwise this is a failure the agent must see."""
    deadline = time.monotonic() + grace
    while not stop.set and time.monotonic() < deadline:
        time.sleep(0.05)
    return stop.set


# --- configuration ----------------------------------------------------------

def env_default(name, default, conv):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return conv(v)
    except ValueError:
        raise UsageError("environment %s=%r is not a valid %s" % (name, v, conv.__name__))


def checkpoint_dir(uri):
    if not uri:
        return ""
    if uri.startswith("file://"):
        path = uri[len("file://"):]
        if not path.startswith("/"):
            raise UsageError("checkpoint URI %r: file:// URLs need an absolute path" % uri)
        return path
    if "://" in uri:
        raise UsageError("checkpoint URI %r: this example only writes local paths or file:// URLs "
                         "(mount object storage, e.g. with s3fs or gcsfuse)" % uri)
    return uri


# --- checkpoint files -------------------------------------------------------

def atomic_save(path, write, binary=False, sync_dir=True):
    """write(f) into a temp file in the same directory + fsync + rename: a
    reader (or a restart after SIGKILL) sees the old file or the new one,
    never half."""
    d = os.path.dirname(path)
    tmp = os.path.join(d, ".%s.tmp-%d" % (os.path.basename(path), os.getpid()))
    with open(tmp, "wb" if binary else "w") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if not sync_dir:
        return
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # directories cannot be fsynced on every filesystem


def atomic_write(path, data, sync_dir=True):
    """atomic_save for a string."""
    atomic_save(path, lambda f: f.write(data), sync_dir=sync_dir)


def read_checkpoint_request(path, round_id):
    """The agent's checkpoint request (FLEETD_CHECKPOINT_REQUEST): why its
    SIGTERM came {round, reason, leaving, deadline, ...}, if the request is
    addressed to round_id (None: any round)."""
    if not path:
        return None
    try:
        with open(path) as f:
            req = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(req, dict) or (round_id is not None and str(req.get("round")) != round_id):
        return None
    return req


def read_drain_notice(path):
    """The agent's drain file (FLEETD_DRAIN_FILE): None while it is absent,
    else its notice as a dict. Presence is the signal; content is advisory."""
    if not path:
        return None
    try:
        with open(path) as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raw = "unreadable: %s" % e
    try:
        notice = json.loads(raw)
    except ValueError:
        notice = {"raw": raw[:200]}
    return notice if isinstance(notice, dict) else {"raw": notice}


class StepEnd:
    """What both trainers do once a step is applied on every rank, mixed into
    a trainer that has step, drained, drain_notice, a (args with steps and
    ckpt_every), save(reason), confirm_saved() and write_done().

    after_step returns "done" when the run has reached its last step (finishing
    beats stopping: nothing would be left to resume), "stop" when a rank was
    asked to stop (the checkpoint is saved and confirmed), else None."""

    def after_step(self, rank, stop, drain):
        if drain and not self.drained:
            self.drained = True
            emit("drain", rank=rank, step=self.step, local=self.drain_notice is not None,
                 notice=self.drain_notice)
            self.save("drain")
        if self.step >= self.a.steps:
            return "done"
        if stop:
            self.save("stop")
            self.confirm_saved()
            return "stop"
        if self.step % self.a.ckpt_every == 0:
            self.save("periodic")
        return None

    def end_run(self, end):
        """Ends a trainer's step loop: True when the group agreed to stop
        (end "stop"); else the run is done (end "done", or no step was left):
        the final checkpoint and the done file (write_done) are written and
        it returns False."""
        if end == "stop":
            return True
        self.save("done")
        self.write_done()
        return False


def add_common_args(p):
    """The flags every example trainer takes: run length, simulated compute
    and checkpointing (each with its TRAIN_* / FLEETD_* environment default)."""
    p.add_argument("--steps", type=int, default=env_default("TRAIN_STEPS", 200, int),
                   help="total optimizer steps of the run (env TRAIN_STEPS)")
    p.add_argument("--step-time", type=float, default=env_default("TRAIN_STEP_TIME", 0.1, float),
                   help="extra seconds of simulated compute per step (env TRAIN_STEP_TIME)")
    p.add_argument("--ckpt", default=os.environ.get("FLEETD_CHECKPOINT_URI", ""),
                   help="checkpoint directory or file:// URL (env FLEETD_CHECKPOINT_URI); empty: none")
    p.add_argument("--ckpt-every", "--checkpoint-every", type=int, default=env_default("TRAIN_CKPT_EVERY", 50, int),
                   help="checkpoint every K steps (env TRAIN_CKPT_EVERY); drain, stop and done always checkpoint")
    p.add_argument("--resume-wait", type=float, default=env_default("TRAIN_RESUME_WAIT", 10.0, float),
                   help="seconds rank 0 waits for the checkpoint FLEETD_RESUME_STEP names to become visible")
    p.add_argument("--lr", type=float, default=0.05)
