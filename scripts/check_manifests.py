#!/usr/bin/env python3
"""Checks the Kubernetes manifests in k8s/base without a cluster.

  scripts/check_manifests.py [--bin-dir target/debug] [--kube-version 1.30]

1. Every file kustomization.yaml lists (and no other .yaml beside it)
   validates against the Kubernetes OpenAPI schemas of --kube-version
   (kubernetes-validate, strict: an unknown field fails), and the KEDA
   ScaledObject against k8s/schemas/keda-scaledobject-v1alpha1.json.
2. Every BoxOffice container runs a real binary and subcommand with real
   flags, and every env var it gets (env, and the keys of the ConfigMaps it
   takes with envFrom) is one that binary reads. The names come from each
   binary's own `--help` ([env: NAME]) for the subcommand the container
   runs, so a flag that is renamed in the code fails here at once; hidden
   flags (test-only fault injection) are deliberately not allowed. The few
   variables read outside clap are listed in EXTRA_ENV, each with the source
   line that reads it (checked to still be there).
3. Each container listens on 0.0.0.0 and its probes, container port and
   prometheus.io/port are on the port it listens on.
4. Each container has readiness and liveness probes, resource requests and
   limits, and the restricted security context; each pod's grace period is
   above its drain time.
5. The ticket worker is a StatefulSet with its pod name as group member id,
   KEDA scales it to at most the topic's partitions, on the group and topic
   the workers use; every workload has a PodDisruptionBudget; the gateway
   has a CPU HPA and is the only pod taking traffic from outside the
   namespace (Prometheus aside).
6. k8s/Dockerfile's dependency layer knows every workspace crate, binary
   crate and manifest (it cannot be built where CI runs), and runs as 65532.

Exits 1 and prints every problem when anything is wrong.
"""

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
BINARIES = ("gateway", "admission", "order-service")
IMAGE = "boxoffice"
UID = 65532
# Namespaces other than the gateway's callers that may reach a pod: only
# Prometheus, for /metrics.
MONITORING_NAMESPACE = "monitoring"

# Env vars read outside clap: (binary, subcommand or None for all,
# name pattern, source file, text that shows it is read there).
EXTRA_ENV = [
    (None, None, r"RUST_LOG", "contract/src/telemetry.rs", 'std::env::var("RUST_LOG")'),
    (None, None, r"OTEL_[A-Z0-9_]+", "contract/src/otlp.rs", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ("order-service", "serve", r"RDKAFKA_[A-Z0-9_]+", "order-service/src/kafka.rs", 'strip_prefix("RDKAFKA_")'),
    ("order-service", "worker", r"RDKAFKA_[A-Z0-9_]+", "order-service/src/kafka.rs", 'strip_prefix("RDKAFKA_")'),
    # The S3 ticket store: object_store's AmazonS3Builder::from_env reads
    # every AWS_* variable it knows.
    ("order-service", "serve", r"AWS_[A-Z0-9_]+", "order-service/src/tickets.rs", "AmazonS3Builder::from_env"),
    ("order-service", "worker", r"AWS_[A-Z0-9_]+", "order-service/src/tickets.rs", "AmazonS3Builder::from_env"),
]

# The gateway's drain on SIGTERM is fixed in code, not a flag.
GATEWAY_DRAIN = ("gateway/src/lib.rs", r"Duration::from_secs\((\d+)\),\s*graceful\.shutdown\(\)")
# Seconds of slack a grace period must leave after the drain it covers.
GRACE_MARGIN_S = 5

problems = []


def problem(where, message):
    problems.append(f"{where}: {message}")


# --- what the binaries accept, from their --help ---------------------------

ARG_LINE = re.compile(r"^\s{2,6}(?:-[A-Za-z], )?--([a-z0-9][a-z0-9-]*)(?P<value>[ =]<[^>]+>)?")
ENV = re.compile(r"\[env: ([A-Za-z_][A-Za-z0-9_]*)(?:=[^\]]*)?\]")
DEFAULT = re.compile(r"\[default: ([^\]]*)\]")
COMMAND_LINE = re.compile(r"^\s{2}([a-z][a-z0-9-]*)\s")


class Cli:
    """One (sub)command's flags: name -> {'env', 'default', 'value'}."""

    def __init__(self, text):
        self.flags = {}
        self.subcommands = []
        section = None
        current = None
        for line in text.splitlines():
            if line and not line[0].isspace():
                section = line.rstrip(":").strip()
                current = None
                continue
            if section == "Commands":
                m = COMMAND_LINE.match(line)
                if m and m.group(1) != "help":
                    self.subcommands.append(m.group(1))
                continue
            m = ARG_LINE.match(line)
            if m:
                current = {"text": line, "value": bool(m.group("value"))}
                self.flags[m.group(1)] = current
            elif current is not None:
                current["text"] += " " + line.strip()
        for flag in self.flags.values():
            env = ENV.search(flag["text"])
            default = DEFAULT.search(flag["text"])
            flag["env"] = env.group(1) if env else None
            flag["default"] = default.group(1) if default else None

    def env_names(self):
        return {f["env"] for f in self.flags.values() if f["env"]}

    def flag_of_env(self, name):
        for flag_name, flag in self.flags.items():
            if flag["env"] == name:
                return flag_name, flag
        return None, None


def help_text(bin_dir, argv):
    exe = Path(bin_dir) / argv[0]
    if not exe.is_file():
        sys.exit(f"check_manifests: {exe} is missing; build it first "
                 "(cargo build --locked --bin gateway --bin admission --bin order-service)")
    # A clean environment: clap prints values of set variables in [env: …].
    out = subprocess.run([str(exe), *argv[1:], "--help"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, timeout=30)
    if out.returncode != 0:
        sys.exit(f"check_manifests: {' '.join(argv)} --help failed: {out.stderr}")
    return out.stdout


def load_clis(bin_dir):
    """{(binary, subcommand or None): Cli}, and {binary: [subcommands]}."""
    clis, subcommands = {}, {}
    for binary in BINARIES:
        top = Cli(help_text(bin_dir, [binary]))
        subcommands[binary] = top.subcommands
        if not top.subcommands:
            clis[(binary, None)] = top
        for sub in top.subcommands:
            clis[(binary, sub)] = Cli(help_text(bin_dir, [binary, sub]))
    return clis, subcommands


def parse_flags(cli, run, argv):
    """The flags of `argv` (what follows the binary and subcommand) against
    `cli`: ({flag: value}, [problems]). A flag taking a value has the rest of
    `--flag=value` or the next argument; a flag without one has "". --help
    and --version do not run the service, so they are problems too."""
    flags, found = {}, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--"):
            found.append(f"{run}: unexpected argument {arg!r}")
            continue
        name, eq, value = arg[2:].partition("=")
        spec = cli.flags.get(name)
        if spec is None or name in ("help", "version"):
            found.append(f"{run} has no flag --{name}")
            continue
        if spec["value"] and not eq:
            if i == len(argv):
                found.append(f"{run}: --{name} needs a value")
                continue
            value = argv[i]
            i += 1
        flags[name] = value
    return flags, found


def check_extra_env_sources():
    for _, _, _, path, needle in EXTRA_ENV:
        source = ROOT / path
        if not source.is_file() or needle not in source.read_text():
            problem("scripts/check_manifests.py",
                    f"EXTRA_ENV says {path} contains {needle!r}; it does not any more (update the list)")


def extra_env_allowed(binary, sub, name):
    for b, s, pattern, _, _ in EXTRA_ENV:
        if b in (None, binary) and s in (None, sub) and re.fullmatch(pattern, name):
            return True
    return False


# --- the manifests ----------------------------------------------------------

def load_manifests(base):
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    listed = kustomization.get("resources") or []
    present = sorted(p.name for p in base.glob("*.yaml") if p.name != "kustomization.yaml")
    for name in sorted(set(present) - set(listed)):
        problem(f"{base.name}/{name}", "not listed in kustomization.yaml's resources (so never applied nor checked)")
    docs = []
    for name in listed:
        path = base / name
        if not path.is_file():
            problem(f"{base.name}/kustomization.yaml", f"lists {name}, which does not exist")
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((f"{base.name}/{name}", doc))
    return docs


def validate_schemas(docs, kube_version, keda_schema):
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    keda = jsonschema.Draft202012Validator(keda_schema)
    for where, doc in docs:
        what = f"{where} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("apiVersion", "").startswith("keda.sh/"):
            for error in sorted(keda.iter_errors(doc), key=lambda e: list(e.path)):
                path = ".".join(str(p) for p in error.path)
                problem(what, f"KEDA schema: {path}: {error.message}")
            continue
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            problem(what, f"Kubernetes {kube_version} schema: {path}: {error.message}")
        except SchemaNotFoundError as error:
            problem(what, error.message)


def by_kind(docs, *kinds):
    return [(w, d) for w, d in docs if d.get("kind") in kinds]


def selector_matches(selector, labels):
    match = (selector or {}).get("matchLabels") or {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def port_number(port, container):
    """A probe's or Service's port, a number or a container port's name."""
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p.get("containerPort")
    return None


class Effective:
    """What one container's process sees: its env (values where they are
    literal) and its command line."""

    def __init__(self, where, container, configmaps):
        self.where = where
        self.values = {}
        self.sources = {}
        for ref in container.get("envFrom") or []:
            prefix = ref.get("prefix", "")
            if "configMapRef" in ref:
                name = ref["configMapRef"]["name"]
                if name not in configmaps:
                    problem(where, f"envFrom ConfigMap {name!r} is not in the manifests: its keys cannot be checked")
                    continue
                for key, value in (configmaps[name].get("data") or {}).items():
                    self.values[prefix + key] = value
                    self.sources[prefix + key] = f"ConfigMap {name}"
            elif "secretRef" in ref:
                problem(where, f"envFrom Secret {ref['secretRef'].get('name')!r}: its keys cannot be checked; "
                        "use env with secretKeyRef, one variable each")
        for env in container.get("env") or []:
            self.values[env["name"]] = env.get("value")
            self.sources[env["name"]] = "env"

    def get(self, cli, env_name, flag_name, argv):
        """The flag's value: from the command line, the env, or its default."""
        for i, arg in enumerate(argv):
            if arg == f"--{flag_name}" and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(f"--{flag_name}="):
                return arg.split("=", 1)[1]
        if self.values.get(env_name) is not None:
            return self.values[env_name]
        flag = cli.flags.get(flag_name)
        return flag["default"] if flag else None


def check_container(where, pod_spec, annotations, container, configmaps, clis, subcommands):
    """Returns (binary, subcommand, Cli, Effective, argv) for the cross-checks."""
    where = f"{where} container {container['name']}"
    image = container.get("image", "")
    if image.split("/")[-1].split(":")[0] != IMAGE:
        problem(where, f"image {image!r} is not the BoxOffice image")
        return None
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    if not argv or argv[0] not in BINARIES:
        problem(where, f"command {argv!r} does not start with one of {', '.join(BINARIES)}")
        return None
    binary, rest = argv[0], argv[1:]
    sub = None
    if subcommands[binary]:
        if not rest or rest[0] not in subcommands[binary]:
            problem(where, f"{binary} needs a subcommand ({', '.join(subcommands[binary])}); got {rest[:1]}")
            return None
        sub, rest = rest[0], rest[1:]
    cli = clis[(binary, sub)]
    run = f"{binary} {sub}" if sub else binary

    # Flags on the command line.
    for found in parse_flags(cli, run, rest)[1]:
        problem(where, found)

    # Env names.
    eff = Effective(where, container, configmaps)
    known = cli.env_names()
    for name in sorted(eff.values):
        if name not in known and not extra_env_allowed(binary, sub, name):
            problem(where, f"{run} does not read {name} (set by {eff.sources[name]})")

    # The listen address and the ports.
    listen_env = cli.flags.get("listen", {}).get("env")
    listen = eff.get(cli, listen_env, "listen", rest)
    m = re.fullmatch(r"(.*):(\d+)", listen or "")
    if not m:
        problem(where, f"{run}: cannot tell the listen port from {listen!r}")
        return binary, sub, cli, eff, rest
    host, port = m.group(1), int(m.group(2))
    if host not in ("0.0.0.0", "[::]", "::"):
        problem(where, f"{run} listens on {listen}: probes and Services cannot reach {host}; "
                f"set {listen_env} or --listen to 0.0.0.0:{port}")
    ports = [p.get("containerPort") for p in container.get("ports") or []]
    if port not in ports:
        problem(where, f"{run} listens on port {port}, which is not among its ports {ports}")
    for kind, paths in (("readinessProbe", ("/readyz", "/healthz")), ("livenessProbe", ("/healthz",))):
        probe = container.get(kind)
        if not probe:
            problem(where, f"no {kind}")
            continue
        get = probe.get("httpGet")
        if not get:
            problem(where, f"{kind} is not an httpGet")
            continue
        probe_port = port_number(get.get("port"), container)
        if probe_port != port:
            problem(where, f"{kind} on port {get.get('port')!r}, but {run} listens on {port}")
        if get.get("path") not in paths:
            problem(where, f"{kind} path {get.get('path')!r}; expected {' or '.join(paths)}")
    startup = container.get("startupProbe")
    if startup and port_number((startup.get("httpGet") or {}).get("port"), container) != port:
        problem(where, f"startupProbe not on port {port}")
    if annotations.get("prometheus.io/scrape") == "true" and annotations.get("prometheus.io/port") != str(port):
        problem(where, f"prometheus.io/port {annotations.get('prometheus.io/port')!r}, but {run} listens on {port}")

    # Resources.
    resources = container.get("resources") or {}
    for part in ("requests", "limits"):
        for res in ("cpu", "memory"):
            if res not in (resources.get(part) or {}):
                problem(where, f"no resources.{part}.{res}")

    # Security context: the container's, over the pod's.
    pod_sc = pod_spec.get("securityContext") or {}
    sc = container.get("securityContext") or {}

    def effective(key):
        return sc.get(key, pod_sc.get(key))

    if effective("runAsNonRoot") is not True:
        problem(where, "runAsNonRoot is not true")
    if effective("runAsUser") != UID:
        problem(where, f"runAsUser is {effective('runAsUser')!r}, not {UID}")
    if sc.get("readOnlyRootFilesystem") is not True:
        problem(where, "readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        problem(where, "allowPrivilegeEscalation is not false")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        problem(where, "capabilities do not drop ALL")
    if (effective("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problem(where, "seccompProfile is not RuntimeDefault")

    # A local ticket store must be a mounted volume (the root is read-only).
    store_env = cli.flags.get("ticket-store", {}).get("env")
    if store_env:
        store = eff.get(cli, store_env, "ticket-store", rest) or ""
        if not re.match(r"^(s3a?|memory)://", store):
            path = store[len("file://"):] if store.startswith("file://") else store
            mounts = [v.get("mountPath", "") for v in container.get("volumeMounts") or []]
            if not path.startswith("/") or not any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts):
                problem(where, f"ticket store {store!r} is on the read-only root filesystem: "
                        "use s3:// or mount a volume there")
    return binary, sub, cli, eff, rest


def drain_seconds(where, binary, sub, cli, eff, argv, pod_spec, container):
    """The drain on SIGTERM the pod's grace period must cover, in seconds."""
    if binary == "gateway":
        path, pattern = GATEWAY_DRAIN
        m = re.search(pattern, (ROOT / path).read_text())
        if not m:
            problem(where, f"cannot find the gateway's drain in {path} (update GATEWAY_DRAIN)")
            return 0
        drain = int(m.group(1))
        pre_stop = ((container.get("lifecycle") or {}).get("preStop") or {})
        sleep = (pre_stop.get("sleep") or {}).get("seconds")
        command = (pre_stop.get("exec") or {}).get("command") or []
        if sleep is None and len(command) == 2 and command[0] == "sleep":
            sleep = int(command[1])
        return drain + (sleep or 0)
    if "drain-timeout-ms" in cli.flags:
        env = cli.flags["drain-timeout-ms"]["env"]
        value = eff.get(cli, env, "drain-timeout-ms", argv)
        return int(value) / 1000
    return 0


def check_dockerfile(path):
    """The stub layer must list every crate: a crate it misses fails the
    image build, which nothing here can run."""
    text = path.read_text()
    where = str(path.relative_to(ROOT))
    members = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]
    args = dict(re.findall(r'^ARG (\w+)="([^"]*)"', text, re.M))
    crates = args.get("CRATES", "").split()
    if sorted(crates) != sorted(members):
        problem(where, f"ARG CRATES {crates} is not the workspace's members {members}")
    bins = sorted(m for m in members if (ROOT / m / "src" / "main.rs").is_file())
    if sorted(args.get("BIN_CRATES", "").split()) != bins:
        problem(where, f"ARG BIN_CRATES {args.get('BIN_CRATES')!r} is not the crates with a src/main.rs {bins}")
    for member in members:
        if f"COPY {member}/Cargo.toml {member}/" not in text:
            problem(where, f"the dependency layer does not copy {member}/Cargo.toml")
        if f"COPY {member} {member}" not in text:
            problem(where, f"the sources of {member} are not copied")
        if list((ROOT / member).glob("build.rs")):
            problem(where, f"{member} has a build.rs, which the stub layer does not copy")
    for binary in BINARIES:
        if f"target/release/{binary}" not in text:
            problem(where, f"the image does not get {binary}")
    if not re.search(r"^USER 65532(:65532)?$", text, re.M):
        problem(where, f"the image does not run as {UID}")
    if not re.search(r"^WORKDIR /var/lib/boxoffice$", text, re.M) or "-o 65532" not in text:
        problem(where, "the image's working directory is not /var/lib/boxoffice owned by 65532")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", default=str(ROOT / "target" / "debug"))
    parser.add_argument("--kube-version", default="1.30")
    parser.add_argument("--dir", default=str(ROOT / "k8s" / "base"))
    parser.add_argument("--keda-schema", default=str(ROOT / "k8s" / "schemas" / "keda-scaledobject-v1alpha1.json"))
    args = parser.parse_args()

    base = Path(args.dir)
    docs = load_manifests(base)
    validate_schemas(docs, args.kube_version, json.loads(Path(args.keda_schema).read_text()))
    check_extra_env_sources()
    check_dockerfile(ROOT / "k8s" / "Dockerfile")
    clis, subcommands = load_clis(args.bin_dir)

    for where, doc in by_kind(docs, "Secret"):
        if doc.get("data") or doc.get("stringData"):
            problem(f"{where} Secret/{doc['metadata']['name']}",
                    "secret values in a manifest; create the Secret with kubectl (k8s/README.md)")
    configmaps = {d["metadata"]["name"]: d for _, d in by_kind(docs, "ConfigMap")}
    used_configmaps = set()

    workloads = []  # (where, doc, binary, sub, cli, eff, argv)
    for where, doc in by_kind(docs, "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"):
        name = f"{where} {doc['kind']}/{doc['metadata']['name']}"
        template = doc["spec"]["template"] if doc["kind"] != "CronJob" else \
            doc["spec"]["jobTemplate"]["spec"]["template"]
        pod_spec = template["spec"]
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        containers = pod_spec.get("containers") or []
        for container in containers:
            for ref in container.get("envFrom") or []:
                if "configMapRef" in ref:
                    used_configmaps.add(ref["configMapRef"]["name"])
            result = check_container(name, pod_spec, annotations, container, configmaps, clis, subcommands)
            if result is None:
                continue
            binary, sub, cli, eff, argv = result
            workloads.append((name, doc, binary, sub, cli, eff, argv))
            drain = drain_seconds(name, binary, sub, cli, eff, argv, pod_spec, container)
            grace = pod_spec.get("terminationGracePeriodSeconds")
            if grace is None:
                problem(name, "no explicit terminationGracePeriodSeconds")
            elif grace < drain + GRACE_MARGIN_S:
                problem(name, f"terminationGracePeriodSeconds {grace} is not above the "
                        f"{drain:g} s drain plus {GRACE_MARGIN_S} s")
        if pod_spec.get("automountServiceAccountToken") is not False:
            problem(name, "automountServiceAccountToken is not false (no BoxOffice pod talks to the API server)")
    for unused in sorted(set(configmaps) - used_configmaps):
        problem(f"ConfigMap/{unused}", "no container takes it (envFrom)")

    # PodDisruptionBudgets and Services select real pods.
    pdbs = [d for _, d in by_kind(docs, "PodDisruptionBudget")]
    for name, doc, *_ in workloads:
        labels = doc["spec"]["template"]["metadata"].get("labels") or {}
        if not any(selector_matches(p["spec"].get("selector"), labels) for p in pdbs):
            problem(name, "no PodDisruptionBudget selects its pods")
    for where, svc in by_kind(docs, "Service"):
        selector = svc["spec"].get("selector") or {}
        targets = [w for w in workloads
                   if selector_matches({"matchLabels": selector}, w[1]["spec"]["template"]["metadata"]["labels"])]
        if not targets:
            problem(f"{where} Service/{svc['metadata']['name']}", "selects no BoxOffice pods")
            continue
        containers = targets[0][1]["spec"]["template"]["spec"]["containers"]
        for port in svc["spec"].get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            if not any(port_number(target, c) in [p.get("containerPort") for p in c.get("ports") or []]
                       for c in containers):
                problem(f"{where} Service/{svc['metadata']['name']}", f"targetPort {target!r} is no container port")

    # The worker: a StatefulSet with stable member ids, behind a headless Service.
    def running(binary, sub):
        return [w for w in workloads if w[2] == binary and w[3] == sub]

    workers = running("order-service", "worker")
    serves = running("order-service", "serve")
    if not workers:
        problem("manifests", "no container runs `order-service worker`")
    if not serves:
        problem("manifests", "no container runs `order-service serve`")
    services = {d["metadata"]["name"]: d for _, d in by_kind(docs, "Service")}
    for name, doc, _, _, _, _, _ in workers:
        if doc["kind"] != "StatefulSet":
            problem(name, "the ticket workers must be a StatefulSet (stable pod names = static member ids)")
            continue
        headless = services.get(doc["spec"].get("serviceName"))
        if not headless or headless["spec"].get("clusterIP") != "None":
            problem(name, f"serviceName {doc['spec'].get('serviceName')!r} is not a headless Service here")
        container = next(c for c in doc["spec"]["template"]["spec"]["containers"]
                         if c.get("command", [None])[0] == "order-service")
        instance = [e for e in container.get("env") or [] if e["name"] == "BOXOFFICE_WORKER_INSTANCE"]
        ref = ((instance[0].get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") if instance else None
        if ref != "metadata.name":
            problem(name, "BOXOFFICE_WORKER_INSTANCE must come from the pod name (fieldRef metadata.name)")

    # KEDA: scales the worker StatefulSet, to at most the partitions, on the
    # topic, group and brokers the workers use.
    scaled = by_kind(docs, "ScaledObject")
    if not scaled:
        problem("manifests", "no KEDA ScaledObject for the ticket workers")
    for where, so in scaled:
        name = f"{where} ScaledObject/{so['metadata']['name']}"
        spec = so.get("spec") or {}
        target = spec.get("scaleTargetRef") or {}
        worker = [w for w in workers if w[1]["metadata"]["name"] == target.get("name")
                  and w[1]["kind"] == target.get("kind", "Deployment")]
        if not worker:
            problem(name, f"scaleTargetRef {target.get('kind', 'Deployment')}/{target.get('name')} "
                    "is not the worker StatefulSet")
            continue
        _, _, _, _, wcli, weff, wargv = worker[0]
        for serve in serves[:1]:
            _, _, scli, seff, sargv = serve[2:]
            partitions = int(seff.get(scli, "BOXOFFICE_PARTITIONS", "partitions", sargv))
            if spec.get("maxReplicaCount", 100) > partitions:
                problem(name, f"maxReplicaCount {spec.get('maxReplicaCount', 100)} is above the "
                        f"{partitions} partitions of the order topic")
        if spec.get("minReplicaCount", 0) < 1:
            problem(name, "minReplicaCount below 1: no worker would watch the topic")
        expected = {
            "consumerGroup": weff.get(wcli, "BOXOFFICE_WORKER_GROUP", "group", wargv),
            "topic": weff.get(wcli, "BOXOFFICE_ORDER_TOPIC", "topic", wargv),
            "bootstrapServers": weff.get(wcli, "KAFKA_BROKERS", "kafka-brokers", wargv),
        }
        kafka = [t for t in spec.get("triggers") or [] if t.get("type") == "kafka"]
        if not kafka:
            problem(name, "no kafka trigger")
        for trigger in kafka:
            meta = trigger.get("metadata") or {}
            for key, value in expected.items():
                if meta.get(key) != value:
                    problem(name, f"kafka trigger {key} {meta.get(key)!r}, but the workers use {value!r}")
            if meta.get("allowIdleConsumers") == "true":
                problem(name, "allowIdleConsumers would scale past the partitions")

    # The gateway: a CPU HPA, an Ingress, and the only pods open to other namespaces.
    gateways = running("gateway", None)
    for name, doc, *_ in gateways:
        hpas = [d for _, d in by_kind(docs, "HorizontalPodAutoscaler")
                if d["spec"]["scaleTargetRef"].get("name") == doc["metadata"]["name"]
                and d["spec"]["scaleTargetRef"].get("kind") == doc["kind"]]
        if not any(m.get("type") == "Resource" and m["resource"].get("name") == "cpu"
                   for h in hpas for m in h["spec"].get("metrics") or []):
            problem(name, "no autoscaling/v2 HPA on CPU")
    ingress_backends = {p["backend"]["service"]["name"]
                        for _, d in by_kind(docs, "Ingress")
                        for r in d["spec"].get("rules") or []
                        for p in (r.get("http") or {}).get("paths") or []}
    gateway_services = {n for n, s in services.items() for g in gateways
                        if selector_matches({"matchLabels": s["spec"].get("selector") or {}},
                                            g[1]["spec"]["template"]["metadata"]["labels"])}
    if not ingress_backends or not ingress_backends <= gateway_services:
        problem("Ingress", f"backends {sorted(ingress_backends)} are not (only) the gateway's Service")
    policies = by_kind(docs, "NetworkPolicy")
    if not any(p["spec"].get("podSelector") == {} and not p["spec"].get("ingress")
               and set(p["spec"].get("policyTypes") or []) == {"Ingress", "Egress"} for _, p in policies):
        problem("NetworkPolicy", "no default-deny policy (podSelector {}, Ingress and Egress, no rules)")
    gateway_labels = [g[1]["spec"]["template"]["metadata"]["labels"] for g in gateways]
    for where, policy in policies:
        name = f"{where} NetworkPolicy/{policy['metadata']['name']}"
        selector = policy["spec"].get("podSelector") or {}
        for_gateway = bool(selector) and all(selector_matches(selector, labels) for labels in gateway_labels) \
            and bool(gateway_labels)
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            if not peers and not for_gateway:
                problem(name, "an ingress rule open to every source on a pod other than the gateway")
            for peer in peers or []:
                if "ipBlock" in peer and not for_gateway:
                    problem(name, "an ipBlock ingress rule on a pod other than the gateway")
                ns = peer.get("namespaceSelector")
                if ns is None:
                    continue
                ns_name = (ns.get("matchLabels") or {}).get("kubernetes.io/metadata.name")
                if not for_gateway and ns_name != MONITORING_NAMESPACE:
                    problem(name, f"lets in traffic from namespace {ns_name or ns!r}; only the gateway may "
                            f"(and Prometheus from {MONITORING_NAMESPACE!r})")

    if problems:
        print(f"check_manifests: {len(problems)} problem(s) in {base}:")
        for p in problems:
            print(f"  - {p}")
        return 1
    print(f"check_manifests: {len(docs)} manifests in {base.relative_to(ROOT)} valid against Kubernetes "
          f"{args.kube_version} and the KEDA schema; {len(workloads)} containers' env names, flags, "
          "ports, probes, resources and security contexts match their binaries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
