"""Runs the aws CLI (v1) from a process that has already loaded it.

The walkthrough test (walkthrough_test.go) runs a page of aws CLI commands;
each `aws` process spends a second or more importing botocore and parsing
service models before doing anything. This keeps one process that has
done that, and forks it for every command: the child runs the same
awscli.clidriver main() as the `aws` script, with the caller's arguments,
working directory, environment and standard streams.

  python awsfork.py serve SOCKET      (the interpreter that has awscli)
  python3 -S awsfork.py call SOCKET ARGS...
"""

import json
import os
import socket
import struct
import sys

PRELOAD = ("ec2", "iam", "sqs", "events", "ssm", "sts")


def serve(path):
    from awscli.clidriver import create_clidriver

    driver = create_clidriver()
    # Build the command table and parse the service models once, here.
    table = driver._get_command_table()
    for name in PRELOAD:
        driver.session.get_service_model(name)
        table[name]._get_command_table()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    while True:
        conn, _ = srv.accept()
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            srv.close()
            for i, fd in enumerate(fds):
                os.dup2(fd, i)
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            sys.stdin = os.fdopen(0, "r", closefd=False)
            sys.stdout = os.fdopen(1, "w", closefd=False)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            try:
                rc = driver.main(req["args"])
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc or 0)
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
        conn.close()


def call(path, args):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(path)
    msg = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(c, [msg], [0, 1, 2])
    c.shutdown(socket.SHUT_WR)
    rc = b""
    while len(rc) < 4:
        chunk = c.recv(4 - len(rc))
        if not chunk:
            sys.exit(255)
        rc += chunk
    sys.exit(struct.unpack("!i", rc)[0] & 0xFF)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        call(sys.argv[2], sys.argv[3:])
