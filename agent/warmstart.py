# fleetd agent: a pre-started ("warm") worker interpreter (docs/agent.md,
# "Warm starts"). The agent runs it as
#
#     PYTHON [FLAGS] warmstart.py SCRIPT.py [ARGS...]
#     PYTHON [FLAGS] warmstart.py -m MODULE [ARGS...]
#
# with the worker's environment minus the per-round variables, in the
# worker's working directory, stdout/stderr on the worker's log pipe, and:
#   fd 3  the handoff, read to EOF: NUL-separated executable path, argc,
#         argv..., then KEY=VALUE... (the full environment);
#   fd 4  readiness: one line, "ok" or "error <why>", then closed.
# It imports the heavy modules, reports, then waits for the handoff, turns
# itself into what `PYTHON [FLAGS] SCRIPT.py [ARGS...]` would be and runs
# the script as __main__. If the imports failed it execs the cold command
# instead, so the script meets its own error exactly as it would cold.
# No module docstring: __main__.__doc__ must stay None.


def _fleetd_warm():
    import os
    import sys

    target = sys.argv[1:]
    module = len(target) >= 2 and target[0] == "-m"
    # What a cold start has before the script runs: sys.path[0] is the
    # script's real directory (the working directory for -m), sys.argv the
    # script's argv ("-m" in argv[0] while the module is being found).
    if not getattr(sys.flags, "safe_path", False) and sys.path:
        sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.realpath(target[0]))
    sys.argv = ["-m"] + target[2:] if module else list(target)

    failed = None
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except BaseException as e:  # a broken install must not be our error: the script meets it itself
        failed = "%s: %s" % (type(e).__name__, e)
    try:
        line = "ok" if failed is None else "error " + " ".join(failed.split())[:500]
        os.write(4, (line + "\n").encode("utf-8", "replace"))
        os.close(4)
    except OSError:
        pass

    chunks = []
    while True:
        b = os.read(3, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(3)
    if not chunks:
        os._exit(0)  # discarded, or the agent is gone: never a worker
    fields = b"".join(chunks).split(b"\0")
    path, argc = fields[0], int(fields[1])
    argv, env = fields[2:2 + argc], dict(kv.split(b"=", 1) for kv in fields[2 + argc:] if b"=" in kv)

    if failed is not None or (not module and not os.path.isfile(target[0])):
        # The cold command, in this very process (same pid, group, pipes,
        # working directory).
        try:
            os.execve(path, argv, env)
        except OSError as e:
            sys.stderr.write("fleetd warm start: exec %s: %s\n" % (os.fsdecode(path), e))
            os._exit(127)

    environ = os.environb
    for k in [k for k in environ if k not in env]:
        del environ[k]
    for k, v in env.items():
        if environ.get(k) != v:
            environ[k] = v
    if hasattr(sys, "orig_argv"):  # 3.10+
        sys.orig_argv = [os.fsdecode(a) for a in argv]

    main = sys.modules["__main__"]
    g = main.__dict__
    for k in [k for k in g if k not in ("__name__", "__builtins__")]:
        del g[k]
    g.update(__doc__=None, __package__=None, __spec__=None, __annotations__={})
    try:
        if module:
            import runpy
            runpy._run_module_as_main(target[1], alter_argv=True)
        else:
            import importlib.machinery
            import io
            script = target[0]
            if sys.version_info >= (3, 9):  # __main__.__file__ is absolute since 3.9 (argv[0] is not)
                script = os.path.abspath(script)
            g.update(__file__=script, __cached__=None,
                     __loader__=importlib.machinery.SourceFileLoader("__main__", script))
            with io.open_code(script) as f:
                source = f.read()
            exec(compile(source, script, "exec", dont_inherit=True), g)
    except (SystemExit, KeyboardInterrupt):
        raise  # exit code and SIGINT semantics as cold
    except BaseException as e:
        # An uncaught exception, reported as the interpreter does, without
        # this frame: traceback (or SyntaxError) on stderr, exit status 1.
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        e.__traceback__ = tb  # the default hook prints the exception's own traceback
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
        sys.excepthook(type(e), e, tb)
        raise SystemExit(1) from None


_fleetd_warm()
