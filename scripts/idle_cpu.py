#!/usr/bin/env python3
"""CPU of the local BoxOffice stack (scripts/up.sh) over a window.

Finds the stack's processes by /proc/*/cmdline, reads utime + stime from
/proc/<pid>/stat at the start and at the end of the window, and prints each
process's share of one core, and the total:

    scripts/idle_cpu.py                 # 10 s
    scripts/idle_cpu.py --seconds 30

Processes: the tansu broker listening on --kafka-port, the gateway, the
admission service, `order-service serve`, the ticket worker(s) and the fake
payment provider (binaries under --bin-dir, so tests of other checkouts are
not counted), redis-server, and every process named postgres, summed (the
postmaster, its helpers and every backend). Redis and PostgreSQL are the
machine's: anything else using them is counted too. A process that starts
during the window counts from its start; one that ends during it is not
counted.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICKS = os.sysconf("SC_CLK_TCK")

# The order of the table.
NAMES = [
    "tansu broker",
    "gateway",
    "admission",
    "order-service serve",
    "ticket worker",
    "payment provider",
    "redis-server",
    "postgres (all)",
]


def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def cpu_ticks(pid):
    """utime + stime of a process (all its threads), in clock ticks."""
    stat = read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def classify(pid, bin_dir, kafka_port):
    """The stack's name for a process, or None if it is not one of the stack's."""
    raw = read(f"/proc/{pid}/cmdline", "rb")
    comm = (read(f"/proc/{pid}/comm") or "").strip()
    if not raw:
        return None
    argv = [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]
    base = os.path.basename(argv[0])
    if comm == "postgres" or base == "postgres":
        return "postgres (all)"
    if comm == "redis-server" or base.startswith("redis-server"):
        return "redis-server"
    if base == "tansu" and "broker" in argv:
        if any(f"127.0.0.1:{kafka_port}" in a or f"localhost:{kafka_port}" in a for a in argv):
            return "tansu broker"
        return None
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    if os.path.dirname(exe) != bin_dir:
        return None
    command = argv[1] if len(argv) > 1 else ""
    if base == "gateway":
        return "gateway"
    if base == "admission":
        return "admission"
    if base == "order-service":
        return {
            "serve": "order-service serve",
            "worker": "ticket worker",
            "payment-provider": "payment provider",
        }.get(command)
    return None


def snapshot(bin_dir, kafka_port):
    """{pid: (name, ticks)} of the stack's processes now."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        name = classify(entry, bin_dir, kafka_port)
        if name is None:
            continue
        ticks = cpu_ticks(entry)
        if ticks is not None:
            found[int(entry)] = (name, ticks)
    return found


def machine_busy():
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    values = [int(v) for v in read("/proc/stat").splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="the window (default 10)")
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"),
                        help="where the stack's binaries are (default target/release)")
    parser.add_argument("--kafka-port", type=int, default=int(os.environ.get("KAFKA_PORT", "9092")),
                        help="the broker's port (default $KAFKA_PORT or 9092)")
    parser.add_argument("--max-total", type=float, default=None,
                        help="exit 1 when the total is above this %% of one core")
    args = parser.parse_args()
    bin_dir = os.path.realpath(args.bin_dir)

    before = snapshot(bin_dir, args.kafka_port)
    busy0, all0 = machine_busy()
    start = time.monotonic()
    time.sleep(args.seconds)
    after = snapshot(bin_dir, args.kafka_port)
    busy1, all1 = machine_busy()
    elapsed = time.monotonic() - start

    used = {name: 0 for name in NAMES}
    pids = {name: 0 for name in NAMES}
    for pid, (name, ticks) in after.items():
        earlier = before.get(pid)
        start_ticks = earlier[1] if earlier and earlier[0] == name else 0
        used[name] += max(ticks - start_ticks, 0)
        pids[name] += 1

    def pct(ticks):
        return 100.0 * ticks / TICKS / elapsed

    missing = [name for name in NAMES if pids[name] == 0]
    print(f"CPU over {elapsed:.1f} s, % of one core ({os.cpu_count()} cores on the machine)")
    print()
    print(f"| {'process':<22} | {'processes':>9} | {'CPU %':>6} |")
    print(f"| {'-' * 22} | {'-' * 9} | {'-' * 6} |")
    for name in NAMES:
        print(f"| {name:<22} | {pids[name]:>9} | {pct(used[name]):>6.1f} |")
    total = pct(sum(used.values()))
    print(f"| {'total':<22} | {sum(pids.values()):>9} | {total:>6.1f} |")
    print()
    machine = 100.0 * (busy1 - busy0) / max(all1 - all0, 1) * (os.cpu_count() or 1)
    print(f"The whole machine meanwhile: {machine:.1f} % of one core (other work included).")
    if missing:
        print(f"Not found: {', '.join(missing)}.")
    if args.max_total is not None and total > args.max_total:
        print(f"The total {total:.1f} % is above {args.max_total} %.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
