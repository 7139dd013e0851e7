#!/usr/bin/env python3
"""Dead letters at scale: one node runs N tasks (one in ten fails once and is dead-lettered),
rotating its queue document several times; the node is killed and restarted, so that it holds
no task's end in memory; the bulk requeue then reads the dead letters from its store, and they
run again and succeed. Prints the timings and the queue's totals.

    cargo build --release && python3 scripts/requeue-at-scale.py [N]   # N = 20000 by default
"""
import json, os, shutil, socket, subprocess, sys, tempfile, time, urllib.error, urllib.request

BIN = os.environ.get("PIECEWORK_BIN", "target/release/piecework")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
DIR = tempfile.mkdtemp(prefix="pw-requeue-")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    PORT = s.getsockname()[1]
BASE = f"http://127.0.0.1:{PORT}"


def start():
    p = subprocess.Popen([BIN, "node", "--data-dir", DIR, "--listen", "/ip4/127.0.0.1/tcp/0",
                          "--http", f"127.0.0.1:{PORT}", "--workers", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("http api:"):
            return p
    raise SystemExit("the node did not start")


def req(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(BASE + path, data=data, method=method,
                               headers={"content-type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as f:
        return json.loads(f.read())


def totals(q):
    return req("GET", f"/v1/queues/{q}")["tasks"]


def settled(q, limit_s):
    t = time.time()
    while time.time() - t < limit_s:
        c = totals(q)
        if c["pending"] + c["assigned"] + c["running"] == 0:
            return c
        time.sleep(0.2)
    raise SystemExit(f"not settled after {limit_s} s: {c}")


def failed_listed(q):
    n, cur = 0, None
    while True:
        r = req("GET", f"/v1/queues/{q}/tasks?state=failed&limit=1000" + (f"&cursor={cur}" if cur else ""))
        n += len(r["tasks"])
        cur = r.get("next_cursor")
        if not cur:
            return n


p = start()
try:
    q = req("POST", "/v1/queues", {"name": "scale"})["queue_id"]
    t0 = time.time()
    for b in range(0, N, 500):
        batch = [{"kind": "fail", "input": {"times": 1}, "max_attempts": 1} if i % 10 == 0
                 else {"kind": "noop", "input": {"i": i}} for i in range(b, min(N, b + 500))]
        while True:
            try:
                req("POST", f"/v1/queues/{q}/tasks", batch)
                break
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
                time.sleep(0.2)
    c = settled(q, 900)
    print(f"ran {N} tasks in {time.time() - t0:.1f} s, epoch {req('GET', f'/v1/queues/{q}')['epoch']}: {c}")
    print(f"dead letters listed: {failed_listed(q)}")
    p.kill(); p.wait()
    p = start()
    t1 = time.time()
    ids = req("POST", f"/v1/queues/{q}/requeue")["task_ids"]
    print(f"bulk requeue after a restart: {len(ids)} tasks in {time.time() - t1:.2f} s")
    t2 = time.time()
    c = settled(q, 600)
    print(f"requeued tasks ended in {time.time() - t2:.1f} s: {c}")
    ok = sum(req("GET", f"/v1/tasks/{t}")["state"] == "succeeded" for t in ids[:50])
    print(f"of 50 requeued, succeeded: {ok}; dead letters listed now: {failed_listed(q)}")
finally:
    p.kill(); p.wait()
    shutil.rmtree(DIR, ignore_errors=True)
