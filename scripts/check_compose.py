#!/usr/bin/env python3
"""Checks compose.yaml without Docker, and with --run starts its services natively.

  scripts/check_compose.py [--bin-dir target/debug] [--run]

Static (always):
1. compose.yaml parses; every ${NAME:?…} it uses is a secret that
   scripts/compose-env.sh writes (and nothing else is interpolated), and
   every secret that script writes is used.
2. Every BoxOffice service runs a real binary, subcommand and flags, is
   given every required flag, and every env var it sets is one its binary
   reads (from the binary's own --help, as scripts/check_manifests.py does:
   its --help parser, its check of the flags and its EXTRA_ENV list are
   reused).
3. Every long-running service has a health check and restart: unless-stopped;
   every depends_on names a service with a condition that service can meet
   (service_healthy: it has a health check; service_completed_successfully:
   a one-shot); every host:port a service's env points at is a service of
   the file it (transitively) depends on, on the port that service listens on.
4. Each BoxOffice service listens on 0.0.0.0, its health check and its
   published ports are on that port; the nginx upstreams are the gateways on
   theirs; the gateways trust the compose network; the workers have distinct
   static member ids; Kafka is 3 brokers with RF 3 / min ISR 2 and the
   services create their topics with the same.
5. If `docker-compose` (v1, Debian's package) is installed:
   `docker-compose config -q` with a generated env file.

--run: a fresh env file from compose-env.sh; every BoxOffice service of the
file (each replica its own process: 2 gateways, 2 admission replicas, 2 ticket
workers, …) started natively from its compose command and environment, each
level of depends_on at once, with only these overrides, printed: host
addresses and ports (redis, postgres, the Kafka brokers, the S3 store,
0.0.0.0 listeners → 127.0.0.1), each service's listen port (replicas share
one in compose; here each gets a free local port, and a service named in
another's env, as http://order-service:8082, is its 127.0.0.1:<port>), the
database name (a fresh one, dropped after), a unique BOXOFFICE_REDIS_PREFIX,
the Kafka topics' RF/min ISR 1/1 (one local tansu broker), and the volumes'
mount paths (a temp folder each); the working directory is a fresh temp
folder, as the image's /var/lib/boxoffice. The keys one-shot runs natively;
the bucket one-shot is a mkdir in the local s3s-fs. There is no nginx: the
fan goes through the gateways in turn. An event is made on the admin API; the
fan joins on the first gateway, is admitted and buys 1 seat on the second
(they share Redis and the signing key), and the order is confirmed with its
tickets.pdf (200 on the first, found in the S3 bucket). Then the replicas:
exactly one admission replica holds the event's lease in Redis and every
other ticks the event too (its /metrics exports the event's admitted total),
and every ticket worker is a member of its group by its static member id,
with partitions assigned (read from the broker's own store). Everything started is stopped on exit, the database and
temp folders removed.

Exits 1 and prints every problem when anything is wrong.
"""

import argparse
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_manifests as manifests  # noqa: E402  (its --help parser, parse_flags and EXTRA_ENV)

ROOT = manifests.ROOT
COMPOSE = ROOT / "compose.yaml"
ENV_SCRIPT = ROOT / "scripts" / "compose-env.sh"
NGINX_CONF = ROOT / "compose" / "nginx.conf"
# The infrastructure services and the port each serves inside the network.
INFRA_PORTS = {"redis": 6379, "postgres": 5432, "minio": 9000}
KAFKA_PORT = 9092
REQUIRED_RF, REQUIRED_MIN_ISR = "3", "2"

problems = manifests.problems
problem = manifests.problem

INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)((?::?[?-])[^}]*)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
# The bucket one-shot's `mc mb [--ignore-existing] ALIAS/BUCKET`.
BUCKET_MADE = re.compile(r"\bmb (?:--ignore-existing )?[A-Za-z0-9_-]+/([a-z0-9.-]+)")
HOST_PORT = re.compile(r"(?:^|://|,|@)([a-z][a-z0-9-]*):(\d+)")


def compose_env_secrets():
    m = re.search(r'^SECRETS="([^"]*)"', ENV_SCRIPT.read_text(), re.M)
    if not m:
        sys.exit(f"check_compose: no SECRETS=\"…\" line in {ENV_SCRIPT}")
    return m.group(1).split()


def interpolate(value, env, where):
    """Compose's interpolation of one string; a missing ${X:?} is a problem."""
    if not isinstance(value, str):
        return value

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        problem(where, f"${{{name}}} is not set")
        return ""
    return INTERPOLATION.sub(sub, value)


def walk_strings(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk_strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk_strings(v, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def env_of(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return {k: (None if v is None else str(v).lower() if isinstance(v, bool) else str(v)) for k, v in env.items()}


def required_flags(help_text):
    usage = next((line for line in help_text.splitlines() if line.startswith("Usage:")), "")
    return re.findall(r"--([a-z0-9-]+) <", usage.replace("[OPTIONS]", ""))


def health_url(service):
    test = (service.get("healthcheck") or {}).get("test") or []
    text = " ".join(test) if isinstance(test, list) else str(test)
    m = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*)", text)
    return (int(m.group(1)), m.group(2)) if m else (None, None)


class Box:
    """One BoxOffice service: its binary, subcommand, flags and env."""

    def __init__(self, name, service, clis, subcommands, helps):
        self.name, self.service = name, service
        self.ok = False
        command = service.get("command")
        where = f"compose.yaml services.{name}"
        if not isinstance(command, list) or not command:
            problem(where, "command must be a list naming the binary")
            return
        self.binary = command[0]
        rest = command[1:]
        self.sub = None
        if subcommands.get(self.binary):
            if not rest or rest[0] not in subcommands[self.binary]:
                problem(where, f"{self.binary} has no subcommand {rest[:1]} (it has {subcommands[self.binary]})")
                return
            self.sub, rest = rest[0], rest[1:]
        self.cli = clis.get((self.binary, self.sub))
        if self.cli is None:
            problem(where, f"{self.binary!r} is not a BoxOffice binary")
            return
        self.argv = rest
        run = f"{self.binary} {self.sub}" if self.sub else self.binary
        self.flags, found = manifests.parse_flags(self.cli, run, rest)
        for message in found:
            problem(where, message)
        self.env = env_of(service)
        for key in self.env:
            if key not in self.cli.env_names() and not manifests.extra_env_allowed(self.binary, self.sub, key):
                problem(where, f"env {key}: {self.binary} {self.sub or ''} does not read it".replace("  ", " "))
        for flag in required_flags(helps[(self.binary, self.sub)]):
            env = self.cli.flags.get(flag, {}).get("env")
            if flag not in self.flags and env not in self.env:
                problem(where, f"the required --{flag} (env {env}) is not given")
        self.ok = True

    def value(self, flag):
        if flag in self.flags:
            return self.flags[flag]
        spec = self.cli.flags.get(flag)
        if spec is None:
            return None
        if spec["env"] in self.env:
            return self.env[spec["env"]]
        return spec["default"]

    def listen_port(self):
        listen = self.value("listen") or ""
        host, _, port = listen.rpartition(":")
        return host, int(port) if port.isdigit() else None


def depends(services, name):
    deps = services[name].get("depends_on") or {}
    return list(deps) if isinstance(deps, (dict, list)) else []


def closure(services, name):
    seen, todo = set(), depends(services, name)
    while todo:
        d = todo.pop()
        if d not in seen and d in services:
            seen.add(d)
            todo.extend(depends(services, d))
    return seen


def check_static(doc, clis, subcommands, helps, secrets):
    services = doc.get("services") or {}
    where = "compose.yaml"
    # Interpolation: only the generated secrets, only as ${NAME:?…}.
    used = set()
    for path, text in walk_strings(doc):
        for m in INTERPOLATION.finditer(text):
            if m.group(0) == "$$":
                continue
            name = m.group(1) or m.group(3)
            used.add(name)
            if name not in secrets:
                problem(f"{where} {path}", f"${{{name}}} is not written by scripts/compose-env.sh")
            if not (m.group(2) or "").startswith(":?"):
                problem(f"{where} {path}", f"${name} must be ${{{name}:?run scripts/compose-env.sh first}} (no default)")
    for name in sorted(set(secrets) - used):
        problem("scripts/compose-env.sh", f"writes {name}, which compose.yaml never uses")

    one_shots = {d for s in services.values() for d, c in (s.get("depends_on") or {}).items()
                 if isinstance(c, dict) and c.get("condition") == "service_completed_successfully"}
    for name, service in services.items():
        w = f"{where} services.{name}"
        deps = service.get("depends_on") or {}
        if isinstance(deps, list):
            problem(w, "depends_on is a list: give each a condition (service_healthy …)")
            deps = {}
        for dep, cond in deps.items():
            cond = (cond or {}).get("condition")
            if dep not in services:
                problem(w, f"depends on {dep!r}, which is no service")
            elif cond == "service_healthy" and not services[dep].get("healthcheck"):
                problem(w, f"waits for {dep} to be healthy, which has no health check")
            elif cond == "service_completed_successfully" and services[dep].get("restart"):
                problem(w, f"waits for the one-shot {dep} to finish, but it restarts")
            elif cond not in ("service_healthy", "service_completed_successfully"):
                problem(w, f"depends on {dep} with condition {cond!r} (not healthy nor completed)")
        if name in one_shots:
            continue
        if service.get("restart") != "unless-stopped":
            problem(w, "restart is not unless-stopped")
        test = (service.get("healthcheck") or {}).get("test")
        if not test:
            problem(w, "no health check")

    boxes = {}
    for name, service in services.items():
        command = service.get("command")
        if isinstance(command, list) and command and command[0] in manifests.BINARIES:
            boxes[name] = Box(name, service, clis, subcommands, helps)
        elif (service.get("build") or {}).get("dockerfile") == "k8s/Dockerfile":
            problem(f"{where} services.{name}", "builds the BoxOffice image but runs no BoxOffice binary")
    boxes = {n: b for n, b in boxes.items() if b.ok}

    ports = {}
    for name, box in boxes.items():
        w = f"{where} services.{name}"
        host, port = box.listen_port()
        ports[name] = port
        if host != "0.0.0.0":
            problem(w, f"listens on {box.value('listen')!r}, not 0.0.0.0 (unreachable from the other containers)")
        hport, hpath = health_url(box.service)
        if hport != port or hpath not in ("/readyz", "/healthz"):
            problem(w, f"health check {box.service.get('healthcheck', {}).get('test')} is not "
                    f"GET /readyz or /healthz on its port {port}")
        for mapping in box.service.get("ports") or []:
            if int(str(mapping).split(":")[-1].split("/")[0]) != port:
                problem(w, f"publishes {mapping!r}, but listens on {port}")
    for name in services:
        if name.startswith("kafka-"):
            ports[name] = KAFKA_PORT
    ports.update({n: p for n, p in INFRA_PORTS.items() if n in services})

    # Every host:port an env value names: a service, on its port, waited for.
    for name, box in boxes.items():
        w = f"{where} services.{name}"
        reach = closure(services, name)
        for key, value in box.env.items():
            for host, port in HOST_PORT.findall(value or ""):
                if host not in services:
                    problem(w, f"env {key} names host {host!r}, which is no service")
                elif ports.get(host) != int(port):
                    problem(w, f"env {key} names {host}:{port}, but {host} listens on {ports.get(host)}")
                elif host not in reach:
                    problem(w, f"env {key} names {host}, which it does not depend on")

    # Kafka: 3 brokers, RF 3 / min ISR 2, and the services create topics so.
    brokers = sorted(n for n in services if n.startswith("kafka-"))
    if len(brokers) != 3:
        problem(where, f"{len(brokers)} Kafka brokers, not 3")
    for b in brokers:
        env = env_of(services[b])
        want = {"KAFKA_DEFAULT_REPLICATION_FACTOR": "3", "KAFKA_MIN_INSYNC_REPLICAS": "2",
                "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "3",
                "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "3",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "2"}
        for key, value in want.items():
            if env.get(key) != value:
                problem(f"{where} services.{b}", f"{key} is {env.get(key)!r}, not {value}")
        if "broker" not in (env.get("KAFKA_PROCESS_ROLES") or "") or not env.get("KAFKA_CONTROLLER_QUORUM_VOTERS"):
            problem(f"{where} services.{b}", "not a KRaft broker")
    for name, box in boxes.items():
        if box.binary == "order-service" and box.sub in ("serve", "worker"):
            w = f"{where} services.{name}"
            if box.value("kafka-replication-factor") != REQUIRED_RF:
                problem(w, f"creates topics with RF {box.value('kafka-replication-factor')}, not {REQUIRED_RF}")
            if box.value("kafka-min-insync-replicas") != REQUIRED_MIN_ISR:
                problem(w, f"creates topics with min ISR {box.value('kafka-min-insync-replicas')}, not {REQUIRED_MIN_ISR}")
            listed = sorted(h for h, _ in HOST_PORT.findall(box.value("kafka-brokers") or ""))
            if listed != brokers:
                problem(w, f"KAFKA_BROKERS names {listed}, not every broker {brokers}")

    def running(binary, sub):
        return [b for b in boxes.values() if b.binary == binary and b.sub == sub]

    workers, serves = running("order-service", "worker"), running("order-service", "serve")
    gateways, admissions = running("gateway", None), running("admission", "serve")
    for what, found, n in (("ticket workers", workers, 2), ("gateways", gateways, 2),
                           ("admission replicas", admissions, 2), ("order services", serves, 1),
                           ("payment providers", running("order-service", "payment-provider"), 1)):
        if len(found) < n:
            problem(where, f"{len(found)} {what}, expected at least {n}")
    ids = [w.value("instance-id") for w in workers]
    if None in ids or len(set(ids)) != len(ids):
        problem(where, f"the workers' static member ids {ids} are not all set and distinct")
    stores = {b.value("ticket-store") for b in workers + serves}
    if len(stores) != 1 or not next(iter(stores)).startswith("s3://"):
        problem(where, f"the workers and the order service do not share one s3:// ticket store: {sorted(stores)}")
    made = set(BUCKET_MADE.findall(" ".join(str(p) for s in services.values()
                                            for p in s.get("entrypoint") or [])))
    for store in stores:
        bucket = re.match(r"s3://([^/]+)", store)
        if bucket and bucket.group(1) not in made:
            problem(where, f"the ticket store's bucket {bucket.group(1)!r} is not the one a one-shot makes {sorted(made)}")
    for b in workers + serves:
        if b.env.get("AWS_ALLOW_HTTP") != "true" and (b.env.get("AWS_ENDPOINT_URL") or "").startswith("http://"):
            problem(f"{where} services.{b.name}", "an http:// S3 endpoint without AWS_ALLOW_HTTP=true")

    # Volumes: a file a service is pointed at is on a volume it mounts.
    for b in boxes.values():
        key = b.value("signing-key") if b.binary == "gateway" else None
        mounts = [str(v).split(":")[1] for v in b.service.get("volumes") or []]
        if key and not any(key.startswith(m.rstrip("/") + "/") for m in mounts):
            problem(f"{where} services.{b.name}", f"signing key {key} is on no volume it mounts")

    # The proxy: nginx's upstreams are the gateways; the gateways trust the network.
    subnets = [ipaddress.ip_network(c["subnet"])
               for c in ((((doc.get("networks") or {}).get("default") or {}).get("ipam") or {}).get("config") or [])]
    if not subnets:
        problem(where, "the default network has no pinned subnet, so the gateways cannot name the proxy")
    for g in gateways:
        trusted = [ipaddress.ip_network(c.strip()) for c in (g.value("trusted-proxies") or "").split(",") if c.strip()]
        if not subnets or not all(any(s.subnet_of(t) for t in trusted if t.version == s.version) for s in subnets):
            problem(f"{where} services.{g.name}", f"BOXOFFICE_TRUSTED_PROXIES {g.value('trusted-proxies')!r} "
                    f"does not cover the compose network {[str(s) for s in subnets]}")
    conf = NGINX_CONF.read_text() if NGINX_CONF.is_file() else ""
    upstreams = set(re.findall(r"^\s*server\s+([a-z0-9-]+):(\d+)", conf, re.M))
    expected = {(g.name, str(ports[g.name])) for g in gateways}
    if upstreams != expected:
        problem("compose/nginx.conf", f"upstreams {sorted(upstreams)} are not the gateways {sorted(expected)}")
    if not re.search(r"proxy_set_header\s+X-Forwarded-For\s+\$remote_addr;", conf):
        problem("compose/nginx.conf", "does not write the client's address into X-Forwarded-For")
    proxies = [n for n, s in services.items()
               if any("compose/nginx.conf" in str(v) for v in s.get("volumes") or [])]
    if len(proxies) != 1:
        problem(where, f"{len(proxies)} services mount compose/nginx.conf, not 1")
    else:
        deps = services[proxies[0]].get("depends_on") or {}
        if not all((deps.get(g.name) or {}).get("condition") == "service_healthy" for g in gateways):
            problem(f"{where} services.{proxies[0]}", "does not wait for every gateway to be healthy")
    # The health checks' HTTP client must be in the image's runtime stage.
    dockerfile = (ROOT / "k8s" / "Dockerfile").read_text()
    runtime = dockerfile.rsplit("\nFROM ", 1)[-1]
    clients = {str(((b.service.get("healthcheck") or {}).get("test") or ["", ""])[1]) for b in boxes.values()}
    for client in sorted(clients):
        if not re.search(rf"apt-get install[^\n]*\b{re.escape(client)}\b", runtime):
            problem("k8s/Dockerfile", f"the runtime image has no {client!r}, which the health checks run")
    return boxes


def docker_compose_config(secrets_file):
    exe = shutil.which("docker-compose")
    if not exe:
        print("check_compose: docker-compose (v1) is not installed; `docker-compose config` skipped")
        return
    out = subprocess.run([exe, "--env-file", str(secrets_file), "-f", str(COMPOSE), "config", "-q"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    if out.returncode != 0:
        problem("docker-compose config", out.stderr.strip() or out.stdout.strip())
    else:
        print("check_compose: `docker-compose config -q` (v1) accepts compose.yaml")


# --- the native run ----------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def read_env_file(path):
    env = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = v
    return env


def http(method, url, token=None, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


class EventKeys:
    """contract/src/keys.rs's keys of one event (only the lease is read here)."""

    def __init__(self, prefix, event):
        self.lease = f"{prefix}:{{{event}}}:lease"


def tansu_group(db, group):
    """A consumer group as the local tansu broker keeps it in its SQLite
    store: {group.instance.id or member id: [(topic, partition), …] assigned}.

    Not DescribeGroups: tansu 0.6.0 with SQLite storage cannot decode its
    own stored group to answer it (the connection is closed), and its answer
    leaves out group.instance.id anyway. The store has each member's join
    request, static id included, and the leader's assignment."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as connection:
        rows = connection.execute(
            "SELECT d.detail FROM consumer_group g JOIN consumer_group_detail d ON d.consumer_group = g.id "
            "WHERE g.name = ?", (group,)).fetchall()
    if not rows:
        return {}
    detail = json.loads(rows[0][0])
    formed = (detail.get("state") or {}).get("Formed") or {}
    assignments = formed.get("assignments") or {}
    members = {}
    for member_id, member in (detail.get("members") or {}).items():
        instance = (member.get("join_response") or {}).get("group_instance_id") or member_id
        members[instance] = consumer_assignment(bytes(assignments.get(member_id) or []))
    return members


def consumer_assignment(data):
    """Kafka's consumer protocol assignment: [(topic, partition), …]."""
    at, out = 2, []  # after the version

    def read_int(n):
        nonlocal at
        at += n
        return int.from_bytes(data[at - n:at], "big", signed=True)

    if len(data) < 6:
        return out
    for _ in range(read_int(4)):
        n = read_int(2)
        topic = data[at:at + n].decode()
        at += n
        out.extend((topic, read_int(4)) for _ in range(read_int(4)))
    return out


class NativeRun:
    def __init__(self, doc, boxes, bin_dir):
        self.doc, self.boxes, self.bin_dir = doc, boxes, Path(bin_dir).resolve()
        self.procs = []  # (name, Popen)
        self.tmp = Path(tempfile.mkdtemp(prefix="boxoffice-compose-"))
        unique = f"{os.getpid()}_{int(time.time())}"
        self.database = f"boxoffice_compose_{unique}"
        self.redis_prefix = f"compose-{unique}"
        self.db_created = False
        self.kafka_pid = None

    def log(self, message):
        print(f"check_compose --run: {message}", flush=True)

    def start_infra(self):
        self.kafka_port = free_port()
        out = subprocess.run(
            ["bash", "-c", f'. scripts/lib.sh; KAFKA_PORT={self.kafka_port}; start_kafka "$1" >&2; echo "$KAFKA_PID"',
             "bash", str(self.tmp / "kafka")], cwd=ROOT, capture_output=True, text=True, timeout=900)
        sys.stderr.write(out.stderr)
        if out.returncode != 0 or not out.stdout.strip().isdigit():
            raise RuntimeError("tansu did not start")
        self.kafka_pid = int(out.stdout.strip())
        subprocess.run(["bash", "-c", ". scripts/lib.sh; ensure_s3s_fs"], cwd=ROOT, check=True, timeout=900)
        s3s = shutil.which("s3s-fs") or str(Path.home() / ".cargo" / "bin" / "s3s-fs")
        self.s3_root = self.tmp / "s3"
        self.s3_root.mkdir()
        self.s3_port = free_port()
        self.spawn("s3s-fs", [s3s, "--host", "127.0.0.1", "--port", str(self.s3_port),
                              "--access-key", self.secrets["S3_ACCESS_KEY"],
                              "--secret-key", self.secrets["S3_SECRET_KEY"], str(self.s3_root)],
                   env={"PATH": os.environ["PATH"]}, cwd=self.tmp)
        self.wait_port(self.s3_port, 20, "s3s-fs")
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f'CREATE DATABASE "{self.database}"'],
                       check=True, timeout=30)
        self.db_created = True

    def spawn(self, name, argv, env, cwd):
        log = open(self.tmp / "logs" / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def wait_port(self, port, seconds, name):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if port_open(port):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not listen on {port} within {seconds} s")

    def map_value(self, value):
        """Compose host names → the local servers (addresses/ports, database name)."""
        def brokers(m):
            hosts = [h.strip() for h in m.group(0).split(",")]
            return f"127.0.0.1:{self.kafka_port}" if all(h.startswith("kafka-") for h in hosts) else m.group(0)
        value = re.sub(r"kafka-\d+:\d+(?:,kafka-\d+:\d+)*", brokers, value)
        value = re.sub(r"@postgres:5432/[A-Za-z0-9_]+", f"@127.0.0.1:5432/{self.database}", value)
        value = re.sub(r"//redis:6379", "//127.0.0.1:6379", value)
        value = re.sub(r"//minio:9000", f"//127.0.0.1:{self.s3_port}", value)
        for name in self.boxes:
            value = re.sub(rf"//{re.escape(name)}:\d+\b", f"//127.0.0.1:{self.ports[name]}", value)
        value = re.sub(r"^0\.0\.0\.0:", "127.0.0.1:", value)
        for mount, local in self.mounts.items():
            if value == mount or value.startswith(mount + "/"):
                value = str(local) + value[len(mount):]
        return value

    def run(self):
        (self.tmp / "logs").mkdir()
        env_file = self.tmp / "compose.env"
        subprocess.run([str(ENV_SCRIPT), str(env_file)], check=True, timeout=30)
        self.secrets = read_env_file(env_file)
        services = self.doc["services"]
        # Volumes: one temp folder each, at the path it is mounted on.
        self.mounts = {}
        for name, service in services.items():
            if name not in self.boxes and name != "keys":
                continue
            for v in service.get("volumes") or []:
                source, target = str(v).split(":")[:2]
                if not source.startswith("."):
                    self.mounts[target] = self.tmp / "volumes" / source
                    self.mounts[target].mkdir(parents=True, exist_ok=True)
        self.start_infra()
        # Each BoxOffice process its own local port: replicas share one in
        # compose (each its own container), and the compose ports may be
        # taken on this machine (scripts/up.sh uses the same ones).
        self.ports = {}
        for name in self.boxes:
            port = free_port()
            while port in self.ports.values():
                port = free_port()
            self.ports[name] = port
        overrides = [f"hosts: redis → 127.0.0.1:6379, postgres → 127.0.0.1:5432 (database {self.database}), "
                     f"kafka-1..3 → tansu 127.0.0.1:{self.kafka_port}, minio → s3s-fs 127.0.0.1:{self.s3_port}, "
                     "0.0.0.0 listeners → 127.0.0.1",
                     "listen ports (the health checks' and the service URLs' too): " + ", ".join(
                         f"{n} {self.boxes[n].listen_port()[1]} → 127.0.0.1:{p}" for n, p in self.ports.items()),
                     f"BOXOFFICE_REDIS_PREFIX={self.redis_prefix} (where the binary reads it)",
                     "BOXOFFICE_KAFKA_REPLICATION_FACTOR=1, BOXOFFICE_KAFKA_MIN_INSYNC_REPLICAS=1 (one broker)",
                     "volumes: " + ", ".join(f"{m} → {p}" for m, p in self.mounts.items())]
        for line in overrides:
            self.log(f"override: {line}")

        # The keys one-shot, natively (its shell script with the volume's path).
        keys = services["keys"]
        script = keys["entrypoint"]
        script = [self.map_value(part) if i < 2 else re.sub(
            r"/keys(?=/|\b)", str(self.mounts["/keys"]), part) for i, part in enumerate(script)]
        subprocess.run(script, check=True, timeout=30, cwd=self.tmp)
        # The bucket one-shot: a bucket is a folder in s3s-fs.
        self.bucket = BUCKET_MADE.search(" ".join(services["bucket"]["entrypoint"])).group(1)
        (self.s3_root / self.bucket).mkdir()

        # Every BoxOffice service, each level of depends_on started at once
        # and healthy before the next (as compose's service_healthy).
        started = []
        remaining = list(self.boxes)
        while remaining:
            ready = [n for n in remaining if not (closure(services, n) & set(remaining))]
            if not ready:
                raise RuntimeError(f"depends_on cycle among {remaining}")
            remaining = [n for n in remaining if n not in ready]
            for name in ready:
                if port_open(self.ports[name]):
                    raise RuntimeError(f"port {self.ports[name]} ({name}) is already taken on this machine")
            procs = {name: self.start_box(name, self.boxes[name]) for name in ready}
            for name in ready:
                self.wait_healthy(name, procs[name])
            started.extend(ready)
        proxies = sorted(n for n, s in services.items()
                         if any("compose/nginx.conf" in str(v) for v in s.get("volumes") or []))
        self.log(f"running natively: {', '.join(started)} ({len(started)} processes); not run: the "
                 "infrastructure images (redis, postgres, kafka-1..3, minio, replaced as above) and the "
                 f"nginx proxy ({', '.join(proxies)}: the gateways are called directly, in turn)")
        self.purchase()
        self.check_replicas()
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}")

    def start_box(self, name, box):
        env = {"PATH": os.environ["PATH"]}
        for key, value in box.env.items():
            env[key] = self.map_value(interpolate(value, self.secrets, f"services.{name}"))
        if "BOXOFFICE_REDIS_PREFIX" in box.cli.env_names():
            env["BOXOFFICE_REDIS_PREFIX"] = self.redis_prefix
        for key in ("BOXOFFICE_KAFKA_REPLICATION_FACTOR", "BOXOFFICE_KAFKA_MIN_INSYNC_REPLICAS"):
            if key in env:
                env[key] = "1"
        args = [self.map_value(interpolate(a, self.secrets, f"services.{name}")) for a in box.argv]
        listen = f"127.0.0.1:{self.ports[name]}"
        if "listen" in box.flags:
            at = next(i for i, a in enumerate(args) if a == "--listen" or a.startswith("--listen="))
            if args[at] == "--listen":
                args[at + 1] = listen
            else:
                args[at] = f"--listen={listen}"
        else:
            env[box.cli.flags["listen"]["env"]] = listen
        argv = [str(self.bin_dir / box.binary)] + ([box.sub] if box.sub else []) + args
        workdir = self.tmp / "workdir" / name  # the image's /var/lib/boxoffice
        workdir.mkdir(parents=True)
        if problems:
            raise RuntimeError("interpolation failed")
        return self.spawn(name, argv, env, workdir)

    def wait_healthy(self, name, proc):
        """Healthy as compose would judge it: its health check's URL answers 2xx."""
        _, path = health_url(self.boxes[name].service)
        port = self.ports[name]
        deadline = time.time() + 60
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} at start")
            try:
                status, _, _ = http("GET", f"http://127.0.0.1:{port}{path}")
                if 200 <= status < 300:
                    self.log(f"{name} healthy (GET {path} on {port})")
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} not healthy (GET {path} on {port}) within 60 s")

    def purchase(self):
        # The admin API of the admission replica compose publishes it on.
        admin = next(n for n, b in self.boxes.items() if b.binary == "admission" and b.service.get("ports"))
        admin_port = self.ports[admin]
        # No nginx: the fan's calls go to the gateways in turn (they share
        # Redis and the signing key, so what one hands out the other takes).
        gateways = sorted(n for n, b in self.boxes.items() if b.binary == "gateway")
        first, second = gateways[0], gateways[-1]
        g1, g2 = (f"http://127.0.0.1:{self.ports[n]}" for n in (first, second))
        self.event = event = "compose-check"
        opens_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
        status, _, body = http("PUT", f"http://127.0.0.1:{admin_port}/admin/v1/events/{event}",
                               token=self.secrets["BOXOFFICE_ADMIN_TOKEN"],
                               body={"name": "Compose check", "capacity": 10, "opens_at": opens_at,
                                     "admission_rate_per_s": 50, "max_active": 100, "access_ttl_s": 120,
                                     "per_fan_limit": 2, "max_queue": 1000, "price_cents": 4500,
                                     "identity": "declared"})
        if status not in (200, 201):
            raise RuntimeError(f"PUT the event: {status} {body[:300]!r}")
        self.log(f"event {event} created on {admin}'s admin API ({status})")

        def call(method, url, token=None, body=None, headers=None, want=(200,)):
            for _ in range(20):
                status, h, data = http(method, url, token, body, headers)
                if status == 429 or (status == 503 and h.get("Retry-After")):
                    time.sleep(min(float(h.get("Retry-After") or 1), 3))
                    continue
                if status not in want:
                    raise RuntimeError(f"{method} {url}: {status} {data[:300]!r}")
                return status, data
            raise RuntimeError(f"{method} {url}: still {status} after retries")

        deadline = time.time() + 30
        while True:  # the gateway sees the event within its cache time
            status, _, data = http("POST", f"{g1}/v1/events/{event}/queue", body={"fan_id": "compose-fan"})
            if status in (200, 201) or time.time() > deadline:
                break
            time.sleep(0.5)
        if status not in (200, 201):
            raise RuntimeError(f"join: {status} {data[:300]!r}")
        ticket = json.loads(data)["queue_ticket"]
        self.log(f"joined the line on {first} ({status})")
        deadline = time.time() + 30
        while True:
            _, data = call("GET", f"{g2}/v1/events/{event}/queue/status", token=ticket)
            state = json.loads(data)
            if state.get("state") == "admitted":
                access = state["access_token"]
                break
            if time.time() > deadline:
                raise RuntimeError(f"not admitted within 30 s: {state}")
            time.sleep(0.6)
        self.log(f"admitted (queue status polled on {second})")
        _, data = call("POST", f"{g2}/v1/events/{event}/orders", token=access, body={"quantity": 1},
                       headers={"Idempotency-Key": "compose-check-1"}, want=(202,))
        bought = json.loads(data)
        order_id, order_token = bought["order_id"], bought["order_token"]
        self.log(f"bought 1 seat on {second}: order {order_id}")
        deadline = time.time() + 90
        while True:
            _, data = call("GET", f"{g1}/v1/orders/{order_id}", token=order_token)
            order = json.loads(data)
            if order.get("status") == "confirmed" and order.get("tickets_issued") == order.get("quantity"):
                break
            if time.time() > deadline:
                raise RuntimeError(f"order not confirmed with its tickets within 90 s: {order}")
            time.sleep(0.5)
        self.log(f"order confirmed, tickets issued (polled on {first})")
        status, h, pdf = http("GET", f"{g1}/v1/orders/{order_id}/tickets.pdf", token=order_token)
        if status != 200 or not pdf.startswith(b"%PDF-"):
            raise RuntimeError(f"tickets.pdf: {status} {pdf[:100]!r}")
        in_bucket = list((self.s3_root / self.bucket).rglob(f"{order_id}.pdf"))
        if not in_bucket:
            raise RuntimeError(f"the PDF is not in the bucket {self.bucket} the one-shot makes")
        self.log(f"GET tickets.pdf on {first}: 200, {len(pdf)} bytes; in the bucket as "
                 f"{in_bucket[0].relative_to(self.s3_root)}")

    def check_replicas(self):
        """Every replica took part: one admission replica leads the event and
        the others tick it too; every ticket worker is in the group."""
        admissions = sorted(n for n, b in self.boxes.items() if b.binary == "admission" and b.sub == "serve")
        lease = EventKeys(self.redis_prefix, self.event).lease
        holder = subprocess.run(["redis-cli", "-h", "127.0.0.1", "--raw", "get", lease],
                                capture_output=True, text=True, timeout=10).stdout.strip()
        pids = {n: p.pid for n, p in self.procs if n in admissions}
        # The lease holds the replica's id: host name, process id, a uuid.
        m = re.search(r"-(\d+)-[0-9a-f]{32}$", holder)
        leaders = [n for n, pid in pids.items() if m and int(m.group(1)) == pid]
        if len(leaders) != 1:
            raise RuntimeError(f"the lease {lease} is {holder!r}, held by none of {pids}")
        for name in admissions:
            _, _, text = http("GET", f"http://127.0.0.1:{self.ports[name]}/metrics")
            text = text.decode(errors="replace")
            readings = {metric: re.search(rf'^{metric}{{event="{self.event}"}} (\S+)$', text, re.M)
                        for metric in ("boxoffice_admitted_total", "boxoffice_admission_rate")}
            total = readings["boxoffice_admitted_total"]
            if not total or float(total.group(1)) < 1:
                raise RuntimeError(f"{name}'s /metrics does not show the event's admitted total: it does not tick it")
            rate = readings["boxoffice_admission_rate"]
            self.log(f"{name} {'leads' if name in leaders else 'stands by for'} {self.event} "
                     f"(admitted total {total.group(1)}, rate in force {rate.group(1) if rate else '?'})")
        self.log(f"exactly one admission replica holds the lease: {leaders[0]} ({holder})")

        workers = {n: b.value("instance-id") for n, b in self.boxes.items()
                   if b.binary == "order-service" and b.sub == "worker"}
        groups = {b.value("group") for n, b in self.boxes.items() if n in workers}
        if len(groups) != 1:
            raise RuntimeError(f"the workers are in different groups {sorted(groups)}")
        group = groups.pop()
        deadline = time.time() + 30
        while True:
            members = tansu_group(self.tmp / "kafka" / "tansu.db", group)
            missing = [n for n, instance in workers.items() if not members.get(instance)]
            if not missing:
                break
            if time.time() > deadline:
                raise RuntimeError(f"tansu's group {group} is {members}: "
                                   f"{', '.join(missing)} not a member with partitions, by its static id")
            time.sleep(0.5)
        self.log(f"tansu's group {group}: every ticket worker is a member by its static id, with partitions: "
                 + "; ".join(f"{instance} {', '.join(f'{t}/{p}' for t, p in members[instance])}"
                             for instance in sorted(members)))

    def stop(self, failed):
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=25)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.kafka_pid:
            try:
                os.kill(self.kafka_pid, signal.SIGTERM)
                for _ in range(50):
                    os.kill(self.kafka_pid, 0)
                    time.sleep(0.1)
                os.kill(self.kafka_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if failed:
            for name, _ in self.procs:
                log = self.tmp / "logs" / f"{name}.log"
                if log.is_file():
                    tail = log.read_text(errors="replace").splitlines()[-15:]
                    print(f"--- {name} (last lines of its log)\n" + "\n".join(tail), file=sys.stderr)
        if self.db_created:
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc",
                            f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'], timeout=30)
        keys = subprocess.run(["redis-cli", "-h", "127.0.0.1", "--scan", "--pattern", f"{self.redis_prefix}:*"],
                              capture_output=True, text=True, timeout=30).stdout.split()
        for i in range(0, len(keys), 500):
            subprocess.run(["redis-cli", "-h", "127.0.0.1", "del", *keys[i:i + 500]],
                           capture_output=True, timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", default=str(ROOT / "target" / "debug"))
    parser.add_argument("--run", action="store_true", help="also start the services natively and buy a ticket")
    args = parser.parse_args()

    doc = yaml.safe_load(COMPOSE.read_text())
    manifests.check_extra_env_sources()
    clis, subcommands = manifests.load_clis(args.bin_dir)
    helps = {key: manifests.help_text(args.bin_dir, [key[0]] + ([key[1]] if key[1] else [])) for key in clis}
    secrets = compose_env_secrets()
    boxes = check_static(doc, clis, subcommands, helps, secrets)
    with tempfile.TemporaryDirectory(prefix="boxoffice-compose-env-") as tmp:
        env_file = Path(tmp) / ".env"
        subprocess.run([str(ENV_SCRIPT), str(env_file)], check=True, capture_output=True, timeout=30)
        written = set(read_env_file(env_file))
        if written != set(secrets):
            problem("scripts/compose-env.sh", f"wrote {sorted(written)}, not its SECRETS {secrets}")
        docker_compose_config(env_file)
    if problems:
        print(f"check_compose: {len(problems)} problem(s):")
        for p in problems:
            print(f"  - {p}")
        return 1
    print(f"check_compose: compose.yaml: {len(doc['services'])} services; {len(boxes)} BoxOffice services' "
          "commands, flags, env names, ports, health checks and dependencies match their binaries")
    if not args.run:
        return 0

    run = NativeRun(doc, boxes, args.bin_dir)
    started = time.time()
    failed = True

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        run.run()
        failed = bool(problems)
    except (RuntimeError, subprocess.CalledProcessError, OSError, KeyError, ValueError, sqlite3.Error) as error:
        print(f"check_compose --run: FAILED: {error}", file=sys.stderr)
    finally:
        run.stop(failed)
    if failed:
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"check_compose --run: the compose services ran natively and sold a ticket in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
