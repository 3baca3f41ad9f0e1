#!/usr/bin/env python3
"""Replays the ncat transcript of proto/PROTOCOL.md against a real shardd and compares every reply."""
# Usage: test_transcript.py PROTOCOL.md           (daemon from $SHARDD)
#        test_transcript.py --record PROTOCOL.md  (prints the transcript as the daemon answers it today)
#
# The transcript is the first fenced block after the line "<!-- transcript -->".
# Lines starting with "$ " are shell commands for humans and are skipped. A line
# that is a JSON object with "ok" or "event" is something the daemon sent; every
# other line is sent to the daemon. Replies must match byte for byte (after the
# masks below) and in order; events may arrive anywhere after the request that
# triggered them, but every one listed must arrive.
#
# Masks, so the replay is deterministic: the daemon's real root path reads as
# DOC_ROOT, the shm segment the test creates reads as DOC_SHM, and "node" (the
# host name) takes the transcript's value.
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

DOC_ROOT = "/tmp/ckpt"
DOC_SHM = "/shardd-demo"
# The bytes the transcript's printf puts in the segment: F32 1.0, 2.0, 3.0, 4.0.
SHM_BYTES = bytes.fromhex("0000803f000000400000404000008040")


def load_transcript(doc):
    lines = open(doc, encoding="utf-8").read().split("\n")
    try:
        i = lines.index("<!-- transcript -->")
    except ValueError:
        sys.exit("no '<!-- transcript -->' marker in " + doc)
    while not lines[i].startswith("```"):
        i += 1
    i += 1
    out = []
    while not lines[i].startswith("```"):
        out.append(lines[i])
        i += 1
    return out


def is_received(line):
    try:
        v = json.loads(line)
    except ValueError:
        return False
    return isinstance(v, dict) and ("ok" in v or "event" in v)


def steps(transcript):
    """[(request line, [expected replies], [expected events])]"""
    out = []
    for line in transcript:
        if not line.strip() or line.startswith("$ "):
            continue
        if is_received(line):
            if not out:
                sys.exit("transcript starts with a reply: " + line)
            v = json.loads(line)
            (out[-1][2] if "event" in v else out[-1][1]).append(line)
        else:
            out.append((line, [], []))
    return out


class Replayer:
    def __init__(self, sock_path, root, shm_name):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(sock_path)
        self.s.settimeout(30)
        self.buf = b""
        self.root, self.shm = root, shm_name

    def send(self, line):
        line = line.replace(DOC_SHM, self.shm)
        self.s.sendall(line.encode() + b"\n")

    def recv(self):
        while b"\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError("the daemon closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return self.mask(line.decode())

    def mask(self, line):
        line = line.replace(self.root, DOC_ROOT).replace(self.shm, DOC_SHM)
        return line


def canon(line, node):
    v = json.loads(line)
    if isinstance(v, dict) and "node" in v and node is not None:
        v["node"] = node
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def take_event(c, seen, want, node):
    """Removes one event equal to want from seen, reading more until it arrives."""
    key = canon(want, node)
    while True:
        for i, e in enumerate(seen):
            if canon(e, node) == key:
                del seen[i]
                return True
        try:
            line = c.recv()
        except socket.timeout:
            return False
        if "event" not in json.loads(line):
            return False
        seen.append(line)


def start_daemon(exe, tmp):
    root = os.path.join(tmp, "root")
    sock = os.path.join(tmp, "shardd.sock")
    log = open(os.path.join(tmp, "shardd.log"), "w")
    p = subprocess.Popen([exe, "--root", root, "--socket", sock], stderr=log)
    deadline = time.time() + 20
    while not os.path.exists(sock):
        if p.poll() is not None or time.time() > deadline:
            log.close()
            sys.exit("shardd did not start:\n" + open(log.name).read())
        time.sleep(0.02)
    return p, os.path.realpath(root), sock


def main():
    args = sys.argv[1:]
    record = "--record" in args
    args = [a for a in args if a != "--record"]
    if len(args) != 1:
        sys.exit("usage: test_transcript.py [--record] PROTOCOL.md")
    exe = os.environ.get("SHARDD")
    if not exe:
        sys.exit("set SHARDD to the shardd executable")
    plan = steps(load_transcript(args[0]))
    doc_node = None
    for _, replies, _ in plan:
        for r in replies:
            v = json.loads(r)
            if "node" in v:
                doc_node = v["node"]

    tmp = tempfile.mkdtemp(prefix="shardd-transcript-")
    shm_name = "/shardd-demo-%d" % os.getpid()
    with open("/dev/shm" + shm_name, "wb") as f:
        f.write(SHM_BYTES)
    p, root, sock = start_daemon(exe, tmp)
    failures = []
    try:
        c = Replayer(sock, root, shm_name)
        seen_events = []  # arrived but not yet matched to a listed event
        for req, replies, events in plan:
            c.send(req)
            got = []
            # Every request gets exactly one reply.
            while len(got) < (1 if record else len(replies)):
                line = c.recv()
                (seen_events if "event" in json.loads(line) else got).append(line)
            if record:
                print(req)
                for line in got:
                    print(line)
                continue
            for want, have in zip(replies, got):
                if canon(want, doc_node) != canon(have, doc_node):
                    failures.append("after %s\n  want %s\n  got  %s" % (req, want, have))
            # Events listed under this request may still be on their way.
            c.s.settimeout(10)
            for want in events:
                if not take_event(c, seen_events, want, doc_node):
                    failures.append("after %s\n  want event %s\n  it did not come" % (req, want))
            c.s.settimeout(30)
        if record:
            for line in seen_events:
                print(line)
        else:
            for line in seen_events:
                failures.append("unexpected event %s" % line)
    except (OSError, EOFError, ValueError) as e:
        failures.append("replay stopped: %s: %s" % (type(e).__name__, e))
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "killed after SIGTERM timed out"
        os.unlink("/dev/shm" + shm_name)
        if rc != 0:
            failures.append("shardd exited with %s after SIGTERM" % rc)
        if os.path.exists(sock):
            failures.append("shardd left its socket behind")
        log = open(os.path.join(tmp, "shardd.log")).read()
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("\n".join(failures))
        print("--- shardd log ---\n" + log)
        return 1
    if not record:
        print("transcript replayed: %d requests, every reply as documented" % len(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
