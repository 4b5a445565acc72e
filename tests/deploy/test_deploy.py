"""deploy/ checked against the code: there is no container engine here, so nothing in deploy/ is
ever run by a container; every claim it makes about the product is checked instead.

- every compose and k8s file parses, and the k8s objects are complete (probes, resources, namespace);
- the registry runs as a replica group on Pulsar (TOOLREG_STORE=pulsar): 3 pods under a
  PodDisruptionBudget in k8s, 2 replicas in compose, no volume that two replicas would share;
- every `toolreg ...` they run parses with the real `build_parser()` (and `serve` targets import);
- every environment variable they give a toolreg container is one the package reads;
- ports agree: metrics port, probes, annotations, healthchecks, Pulsar's 6650/8080;
- the Pulsar init step creates every namespace the code's topics live in, keeps the persistent ones
  (the replicated store's) without limit, and runs, twice, against a stand-in `pulsar-admin` that
  records what it is asked;
- the token variant authenticates every product container and turns token auth on in the broker;
- the Containerfile installs from exactly what it copies (an sdist built from those files alone);
- the bridge/smoke scripts of compose and k8s pass against real toolreg processes on a real broker;
- docs/operators.md names every setting, metric, topic and flag of the long-running commands.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from apache_pulsar import KIND_GRANTS, RESERVED_SUBSCRIPTIONS
from support import toolreg_background, toolreg_env

from discovery.broker import EmbeddedBroker
from discovery.cli.main import build_parser
from discovery.cli.serve import load_service_class
from discovery.web.health import DEFAULT_METRICS_PORT
from toolservice_base import topics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PACKAGES = ("toolservice_base", "discovery", "agent_bridge")
TOOLREG_IMAGE = "toolreg:latest"
PULSAR_IMAGE = re.compile(r"^apachepulsar/pulsar:4\.\d+\.\d+$")
PULSAR_PORT, PULSAR_ADMIN_PORT = 6650, 8080  # Apache Pulsar's brokerServicePort and webServicePort defaults
INTERPRETER_ENV = {"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK"}
"""Read by Python and pip, not by the package: the Containerfile may set these."""


# --- loading -------------------------------------------------------------------


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def compose(variant: str = "base") -> dict[str, Any]:
    base = load_yaml(DEPLOY / "compose.yaml")[0]
    if variant == "base":
        return base
    return merge_compose(base, load_yaml(DEPLOY / "compose.auth.yaml")[0])


def merge_compose(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge of `-f a -f b`: mappings merge key by key, volumes by target, scalars and commands replace."""
    merged = json.loads(json.dumps(base))
    for section in ("services", "volumes"):
        for name, spec in (override.get(section) or {}).items():
            target = merged.setdefault(section, {}).setdefault(name, {}) or {}
            merged[section][name] = target
            for key, value in (spec or {}).items():
                if key in ("environment", "healthcheck", "depends_on") and isinstance(value, dict):
                    target[key] = {**(target.get(key) or {}), **value}
                elif key == "volumes":
                    by_target = {str(v).split(":")[1]: v for v in target.get("volumes", [])}
                    by_target.update({str(v).split(":")[1]: v for v in value})
                    target["volumes"] = list(by_target.values())
                else:
                    target[key] = value
    return merged


def k8s_docs() -> list[dict[str, Any]]:
    return [doc for path in sorted(K8S.glob("*.yaml")) for doc in load_yaml(path)]


def k8s_find(kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_specs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in k8s_docs()
        if d["kind"] in ("Deployment", "Job")
    ]


def toolreg_containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, pod spec, container) for every k8s container running the toolreg image."""
    return [
        (f"{where}/{c['name']}", pod, c)
        for where, pod in pod_specs()
        for c in pod["containers"]
        if c["image"] == TOOLREG_IMAGE
    ]


def compose_toolreg_services(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {name: s for name, s in spec["services"].items() if s.get("image") == TOOLREG_IMAGE}
    assert found, "no service runs the toolreg image"
    for name, service in found.items():
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Containerfile"}, name
    return found


def k8s_env(container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as it will be: envFrom ConfigMaps first, then `env`."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update({k: str(v) for k, v in k8s_find("ConfigMap", source["configMapRef"]["name"])["data"].items()})
    for item in container.get("env", []):
        env[item["name"]] = str(item.get("value", ""))
    return env


def containerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of deploy/Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Containerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


# --- what the code says ----------------------------------------------------------


def _string_value(node: ast.AST, constants: dict[str, str]) -> str | None:
    """A string literal, or a module-level name bound to one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def env_vars_read_by_the_package() -> set[str]:
    """Names passed to os.environ.get / os.getenv / os.environ[...] or declared (`variables.setting`, `Variable`)
    anywhere in the three packages (constants resolved)."""
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            constants = {
                target.id: node.value.value
                for node in tree.body
                if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                for target in node.targets
                if isinstance(target, ast.Name)
            }

            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and node.args:
                    func = ast.unparse(node.func)
                    if func in ("os.environ.get", "os.getenv", "environ.get", "setting", "Variable"):
                        names.add(_string_value(node.args[0], constants) or "")
                elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
                    names.add(_string_value(node.slice, constants) or "")
    names.discard("")
    return names


def namespaces_the_code_uses() -> set[str]:
    """tenant/namespace of every topic of the default topicspace, its default service queues and the
    registry's allowed queue namespaces."""
    default = topics.DEFAULT
    uris = [getattr(default, name) for name in dir(topics.Topics) if isinstance(getattr(topics.Topics, name), property)]
    uris = [uri for uri in uris if isinstance(uri, str) and "://" in uri]
    uris += [default.request_queue("x"), default.response_queue("x")]
    found = {"/".join(uri.split("://", 1)[1].split("/")[:2]) for uri in uris}
    return found | set(default.queue_namespaces)


def toolreg_argvs(entrypoint: list[str] | None, command: list[str] | str) -> list[list[str]]:
    """The toolreg command lines a container runs: its command (entry point `toolreg`), or each
    `toolreg ...` inside an `sh -c` script."""
    if entrypoint in (None, ["toolreg"]):
        assert isinstance(command, list)
        return [command]
    assert entrypoint in (["/bin/sh", "-c"], ["sh", "-c"]), f"unexpected entry point {entrypoint}"
    script = command[0] if isinstance(command, list) else command
    script = re.sub(r"\s\d*>>?\s*(&\d+|\S+)", " ", script)  # redirections are not arguments
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    argvs: list[list[str]] = []
    current: list[str] = []
    for token in list(lexer) + [";"]:
        if token and set(token) <= set(";&|"):
            if current and current[0] == "toolreg":
                argvs.append(current[1:])
            current = []
        elif token in ("do", "then", "else", "until", "while", "if", "!") and not current:
            continue
        else:
            current.append(token)
    assert argvs, f"no toolreg command in {script!r}"
    return argvs


def check_toolreg_argv(argv: list[str], where: str) -> None:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `toolreg {' '.join(argv)}` is not a valid toolreg command line")
    if args.command == "serve":
        load_service_class(args.target)


# --- the files parse and are complete ------------------------------------------------


def test_every_deploy_file_parses() -> None:
    files = [DEPLOY / "compose.yaml", DEPLOY / "compose.auth.yaml", *sorted(K8S.glob("*.yaml"))]
    assert len(files) >= 8
    for path in files:
        assert load_yaml(path), f"{path} is empty"
    kinds = {(d["kind"], d["metadata"]["name"]) for d in k8s_docs()}
    for expected in [
        ("Namespace", "toolreg"),
        ("ConfigMap", "toolreg-config"),
        ("Secret", "toolreg-store-token"),
        ("Secret", "toolreg-service-token"),
        ("Secret", "toolreg-agent-token"),
        ("Deployment", "toolreg-registry"),
        ("Deployment", "toolreg-joke"),
        ("Deployment", "toolreg-calculator"),
        ("Job", "toolreg-pulsar-init"),
        ("Job", "toolreg-smoke"),
    ]:
        assert expected in kinds
    for doc in k8s_docs():
        assert doc.get("apiVersion") and doc["metadata"].get("name")
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "toolreg", doc["metadata"]["name"]
    # kubectl apply -f deploy/k8s/ goes in file-name order: the Namespace must come first
    assert sorted(K8S.glob("*.yaml"))[0].name == "00-namespace.yaml"


def test_deployments_have_probes_resources_and_a_hardened_pod() -> None:
    deployments = [d for d in k8s_docs() if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"toolreg-registry", "toolreg-joke", "toolreg-calculator"}
    for deployment in deployments:
        spec = deployment["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        pod = spec["template"]["spec"]
        assert pod["enableServiceLinks"] is False, (
            "service links would inject *_PORT variables, e.g. TOOLREG_METRICS_PORT"
        )
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            requests = container["resources"]["requests"]
            assert requests["cpu"] and requests["memory"]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for name in ("toolreg-joke", "toolreg-calculator"):
        assert k8s_find("Deployment", name)["spec"]["replicas"] == 2
    for service in ("joke", "calculator"):
        assert compose()["services"][service]["deploy"]["replicas"] == 2


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels only; the manifests use nothing else) selects these labels."""
    assert set(selector) == {"matchLabels"}, f"unexpected selector {selector}"
    return selector["matchLabels"].items() <= labels.items()


def data_dir() -> str:
    env = dict(
        pair.split("=", 1)
        for instruction, args in containerfile()
        if instruction == "ENV"
        for pair in args.split()
        if "=" in pair
    )
    return env["TOOLREG_DATA_DIR"]


def test_the_registry_runs_as_a_replica_group_on_pulsar() -> None:
    """`toolreg up` with TOOLREG_STORE=pulsar, several at once: state on the broker, nothing on a volume two would
    share."""
    deployment = k8s_find("Deployment", "toolreg-registry")
    spec = deployment["spec"]
    assert spec["replicas"] >= 3, (
        "one active replica and two standbys, so one can be disrupted while another takes over"
    )
    assert spec["strategy"]["type"] == "RollingUpdate" and spec["strategy"]["rollingUpdate"]["maxUnavailable"] in (0, 1)
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    (container,) = pod["containers"]
    assert container["args"] == ["up"]
    env = k8s_env(container)
    assert env["TOOLREG_STORE"] == "pulsar" and env.get("TOOLREG_BROKER", "apache-pulsar") == "apache-pulsar"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # state is on Pulsar: no claim anywhere, and the data directory (the process's lock file) on an emptyDir
    assert not [d for d in k8s_docs() if d["kind"] == "PersistentVolumeClaim"]
    assert not [v for _, p in pod_specs() for v in p.get("volumes", []) if "persistentVolumeClaim" in v]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == data_dir())
    assert next(v for v in pod["volumes"] if v["name"] == mount["name"]) == {"name": mount["name"], "emptyDir": {}}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True, "so the data directory must be a volume"

    budgets = [d for d in k8s_docs() if d["kind"] == "PodDisruptionBudget"]
    covering = [b for b in budgets if selects(b["spec"]["selector"], labels)]
    assert len(covering) == 1, "one PodDisruptionBudget selects the registry's pods"
    budget = covering[0]
    assert (
        budget["apiVersion"] == "policy/v1"
        and budget["spec"]["maxUnavailable"] == 1
        and "minAvailable" not in budget["spec"]
    )
    for doc in k8s_docs():  # and nothing else's
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] != "toolreg-registry":
            assert not selects(budget["spec"]["selector"], doc["spec"]["template"]["metadata"]["labels"]), doc[
                "metadata"
            ]["name"]
    service = k8s_find("Service", "toolreg-registry")["spec"]
    assert service["selector"].items() <= labels.items()

    for variant in ("base", "auth"):
        registry = compose(variant)["services"]["registry"]
        assert registry["command"] == ["up"] and registry["environment"]["TOOLREG_STORE"] == "pulsar", variant
        assert registry["deploy"]["replicas"] >= 2, variant
        mounts = [str(v).split(":")[1] for v in registry.get("volumes", [])]
        assert data_dir() not in mounts, f"compose ({variant}): replicas sharing {data_dir()} would share one lock file"
        assert all(str(v).endswith(":ro") for v in registry.get("volumes", [])), (
            f"compose ({variant}): only read-only mounts"
        )
    assert "toolreg-data" not in (compose().get("volumes") or {}), "no store volume is left behind"


def test_the_broker_is_apache_pulsar_4_standalone_with_its_own_health_check() -> None:
    pulsar = compose()["services"]["pulsar"]
    assert PULSAR_IMAGE.match(pulsar["image"])
    script = " ".join(pulsar["command"])
    assert "bin/apply-config-from-env.py conf/standalone.conf" in script
    assert re.search(r"exec bin/pulsar standalone\b.*--advertised-address pulsar", script)
    assert pulsar["hostname"] == "pulsar"
    assert pulsar["healthcheck"]["test"] == ["CMD", "bin/pulsar-admin", "brokers", "healthcheck"]
    init = compose()["services"]["pulsar-init"]
    assert init["depends_on"] == {"pulsar": {"condition": "service_healthy"}}
    assert (
        init["image"]
        == pulsar["image"]
        == k8s_find("Job", "toolreg-pulsar-init")["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    for name in compose_toolreg_services(compose()):
        depends = compose()["services"][name]["depends_on"]
        assert depends.get("pulsar-init") == {"condition": "service_completed_successfully"} or "registry" in depends, (
            name
        )


def test_compose_has_no_unintended_interpolation() -> None:
    """Compose replaces $VAR in the file itself; a script's own $ must be written $$ (there are none today)."""
    for name in ("compose.yaml", "compose.auth.yaml"):
        text = (DEPLOY / name).read_text()
        assert not re.search(r"(?<!\$)\$(?!\$)", text.replace("$$", "")), f"{name} has a bare $"


def test_k8s_scripts_have_no_variable_references() -> None:
    """Kubernetes expands $(NAME) in command and args: a shell `$(...)` would be at its mercy."""
    for where, _, container in toolreg_containers():
        assert "$(" not in " ".join(container.get("command", []) + container.get("args", [])), where


# --- commands, variables, ports --------------------------------------------------------


def test_every_toolreg_command_in_deploy_exists() -> None:
    checked = 0
    for variant in ("base", "auth"):
        for name, service in compose_toolreg_services(compose(variant)).items():
            for argv in toolreg_argvs(service.get("entrypoint"), service["command"]):
                check_toolreg_argv(argv, f"compose ({variant}) {name}")
                checked += 1
    for where, _, container in toolreg_containers():
        entrypoint = container.get("command")
        for argv in toolreg_argvs(entrypoint, container["args"] if entrypoint is None else container["args"][0]):
            check_toolreg_argv(argv, f"k8s {where}")
            checked += 1
    assert checked >= 16
    commands = {
        tuple(argv[:1])
        for service in compose()["services"].values()
        if service.get("image") == TOOLREG_IMAGE
        for argv in toolreg_argvs(service.get("entrypoint"), service["command"])
    }
    assert {("up",), ("serve",), ("tools",), ("call",)} <= commands


def test_the_image_entry_point_is_the_toolreg_script() -> None:
    instructions = dict(containerfile())
    assert json.loads(instructions["ENTRYPOINT"]) == ["toolreg"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["toolreg"] == "discovery.cli:main"
    assert containerfile()[0][0] == "FROM" and re.match(r"python:3\.1[1-9]", containerfile()[0][1])
    user = instructions["USER"].split(":")[0]
    assert user == "10001", "compose.auth.yaml and k8s grant the token file to uid 10001"
    for _, pod, container in toolreg_containers():
        assert pod["securityContext"]["runAsUser"] == int(user)
        assert "command" not in container or container["command"] == ["/bin/sh", "-c"]


def test_every_environment_variable_named_is_read_by_the_code() -> None:
    read = env_vars_read_by_the_package()
    assert {
        "PULSAR_URL",
        "PULSAR_AUTH_TOKEN",
        "PULSAR_AUTH_TOKEN_FILE",
        "TOOLREG_DATA_DIR",
        "TOOLREG_METRICS_PORT",
    } <= read
    named: dict[str, str] = {}
    for variant in ("base", "auth"):
        for name, service in compose_toolreg_services(compose(variant)).items():
            named.update({var: f"compose ({variant}) {name}" for var in service.get("environment", {})})
    for where, _, container in toolreg_containers():
        named.update({var: f"k8s {where}" for var in k8s_env(container)})
    for instruction, arguments in containerfile():
        if instruction == "ENV":
            named.update({pair.split("=", 1)[0]: "Containerfile" for pair in arguments.split() if "=" in pair})
    unknown = {var: where for var, where in named.items() if var not in read and var not in INTERPRETER_ENV}
    assert not unknown, f"variables no code reads: {unknown}"


def test_ports_agree_with_the_code() -> None:
    port = str(DEFAULT_METRICS_PORT)
    assert dict(containerfile())["EXPOSE"] == port
    spec = compose()
    for name, service in compose_toolreg_services(spec).items():
        env = service["environment"]
        url = urlsplit(env["PULSAR_URL"])
        assert (url.scheme, url.hostname, url.port) == ("pulsar", "pulsar", PULSAR_PORT), name
        if "TOOLREG_METRICS_PORT" in env:
            assert env["TOOLREG_METRICS_PORT"] == port and env["TOOLREG_METRICS_HOST"] == "0.0.0.0", name
            assert f"http://127.0.0.1:{port}/readyz" in " ".join(service["healthcheck"]["test"]), name
        else:
            assert "healthcheck" not in service, f"{name} has no health server to check"
    registry = spec["services"]["registry"]
    assert registry["deploy"]["replicas"] > 1
    # published on the host's loopback only, and on a port of the host's choosing: two replicas cannot share one
    assert registry["ports"] == [{"target": DEFAULT_METRICS_PORT, "host_ip": "127.0.0.1", "protocol": "tcp"}]
    for name, service in spec["services"].items():
        if service.get("deploy", {}).get("replicas", 1) > 1:
            for published in service.get("ports", []):
                if isinstance(published, dict):
                    fixed = str(published.get("published") or "")
                else:  # [IP:][HOST_PORT:]CONTAINER_PORT
                    parts = str(published).split(":")
                    fixed = parts[-2] if len(parts) > 1 else ""
                assert not fixed, f"{name}: its replicas would collide on host port {fixed}"
    admin = urlsplit(spec["services"]["pulsar-init"]["environment"]["PULSAR_ADMIN_URL"])
    assert (admin.hostname, admin.port) == ("pulsar", PULSAR_ADMIN_PORT)

    config = k8s_find("ConfigMap", "toolreg-config")["data"]
    assert config["TOOLREG_METRICS_PORT"] == port and config["TOOLREG_METRICS_HOST"] == "0.0.0.0"
    broker = urlsplit(config["PULSAR_URL"])
    assert (broker.scheme, broker.port) == ("pulsar", PULSAR_PORT)
    init_env = k8s_env(k8s_find("Job", "toolreg-pulsar-init")["spec"]["template"]["spec"]["containers"][0])
    init_admin = urlsplit(init_env["PULSAR_ADMIN_URL"])
    assert (init_admin.hostname, init_admin.port) == (
        broker.hostname,
        PULSAR_ADMIN_PORT,
    ), "init and toolreg must target one cluster"
    for doc in k8s_docs():
        if doc["kind"] != "Deployment":
            continue
        template = doc["spec"]["template"]
        assert template["metadata"]["annotations"]["prometheus.io/port"] == port
        for container in template["spec"]["containers"]:
            assert k8s_env(container)["TOOLREG_METRICS_PORT"] == port
            assert container["ports"] == [{"name": "metrics", "containerPort": DEFAULT_METRICS_PORT}]
            for probe in ("livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["port"] in ("metrics", DEFAULT_METRICS_PORT)
    service = k8s_find("Service", "toolreg-registry")["spec"]["ports"][0]
    assert (service["port"], service["targetPort"]) == (DEFAULT_METRICS_PORT, "metrics")


# --- the Pulsar init step ------------------------------------------------------------------


def init_script_layout() -> tuple[str, set[str]]:
    text = (DEPLOY / "pulsar-init.sh").read_text()
    tenant = re.search(r'^TENANT="\$\{TOOLREG_TOPICSPACE:-([^}"]+)\}"$', text, re.M)  # the default topicspace
    names = re.search(r'^NAMESPACES="([^"]+)"$', text, re.M)
    assert tenant and names
    return tenant.group(1), {f"{tenant.group(1)}/{n}" for n in names.group(1).split()}


def persistent_namespaces_the_code_uses() -> set[str]:
    """tenant/namespace of every persistent topic of the default topicspace: the replicated store's state."""
    default = topics.DEFAULT
    uris = [getattr(default, name) for name in dir(topics.Topics) if isinstance(getattr(topics.Topics, name), property)]
    return {
        "/".join(uri.split("://", 1)[1].split("/")[:2])
        for uri in uris
        if isinstance(uri, str) and uri.startswith("persistent://")
    }


def unlimited_namespaces() -> set[str]:
    text = (DEPLOY / "pulsar-init.sh").read_text()
    found = re.search(r'^UNLIMITED="([^"]*)"$', text, re.M)
    assert found
    return {f"{init_script_layout()[0]}/{n}" for n in found.group(1).split()}


def test_the_init_step_creates_every_namespace_the_code_uses() -> None:
    _, created = init_script_layout()
    assert (
        created
        == namespaces_the_code_uses()
        == {"tg/request", "tg/response", "tg/notify", "tg/discovery", "tg/state", "tg/audit"}
    )
    assert created == {f"tg/{namespace}" for namespace in topics.NAMESPACES}
    # the replicated store's log and snapshots must outlive every reader: their namespace keeps everything
    assert unlimited_namespaces() == {"tg/state"}
    # the MCP front's audit records are kept for a retention the operator chooses (TOOLREG_AUDIT_RETENTION)
    assert persistent_namespaces_the_code_uses() == {"tg/state", "tg/audit"}
    embedded = k8s_find("ConfigMap", "toolreg-pulsar-init")["data"]["pulsar-init.sh"]
    assert embedded == (DEPLOY / "pulsar-init.sh").read_text(), (
        "deploy/k8s/pulsar-init.yaml must embed deploy/pulsar-init.sh verbatim"
    )
    init = compose()["services"]["pulsar-init"]
    assert "./pulsar-init.sh:/toolreg/pulsar-init.sh:ro" in init["volumes"] and init["command"] == [
        "sh",
        "/toolreg/pulsar-init.sh",
    ]


FAKE_ADMIN = """#!/bin/sh
# Stand-in for bin/pulsar-admin: records each call, keeps tenants and namespaces in files.
echo "$*" >> "$STATE/calls"
while [ "${1#--}" != "$1" ]; do shift 2; done
case "$1 $2" in
  "tenants get") grep -qx "$3" "$STATE/tenants" 2>/dev/null ;;
  "tenants create") echo "$3" >> "$STATE/tenants" ;;
  "namespaces list") cat "$STATE/namespaces" 2>/dev/null; true ;;
  "namespaces create") echo "$3" >> "$STATE/namespaces" ;;
  "namespaces set-retention") grep -qx "$3" "$STATE/namespaces" ;;
  "namespaces grant-permission") true ;;
  "namespaces grant-subscription-permission") true ;;
  "namespaces revoke-permission") true ;;
  "topics create") true ;;
  "topics grant-permission") true ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_the_init_script_is_idempotent_and_passes_auth(tmp_path: Path, shell: str) -> None:
    argv0 = shutil.which(shell)
    if argv0 is None:
        pytest.skip(f"{shell} is not installed")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "pulsar-admin"
    fake.write_text(FAKE_ADMIN)
    fake.chmod(0o755)
    token = tmp_path / "admin.token"
    token.write_text("jwt")
    command = [argv0, str(DEPLOY / "pulsar-init.sh")]
    env = {
        "PATH": os.environ["PATH"],
        "PULSAR_HOME": str(tmp_path),
        "STATE": str(tmp_path),
        "PULSAR_ADMIN_URL": "http://broker:8080",
    }

    def run(**extra: str) -> list[str]:
        (tmp_path / "calls").unlink(missing_ok=True)
        result = subprocess.run(command, env={**env, **extra}, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        return (tmp_path / "calls").read_text().splitlines()

    first = run(PULSAR_CLUSTER="pulsar")
    assert all(call.startswith("--admin-url http://broker:8080 ") for call in first)
    assert "--admin-url http://broker:8080 tenants create tg --allowed-clusters pulsar" in first
    assert not [call for call in first if "grant" in call], "no role given: nothing granted"
    created = {call.split()[-1] for call in first if " namespaces create " in call}
    assert created == init_script_layout()[1]
    second = run(PULSAR_ADMIN_TOKEN_FILE=str(token), TOOLREG_ROLE="toolreg")
    assert not [call for call in second if " create " in call], "a second run creates nothing"
    assert all(f"--auth-params file://{token} " in call for call in second)
    grants = [call for call in second if "grant-permission" in call]
    assert {call.split()[-5] for call in grants} == init_script_layout()[1]
    assert all(call.endswith("--role toolreg --actions produce,consume") for call in grants)
    audited = run(TOOLREG_AUDIT_RETENTION="90d")
    # set on every run: a namespace made before (or by hand) gets it too; the audit trail for as long as asked
    for calls, audit in ((first, "30d"), (second, "30d"), (audited, "90d")):
        retention = [
            call.split(" namespaces set-retention ", 1)[1] for call in calls if " namespaces set-retention " in call
        ]
        kept = [f"{namespace} --size -1 --time -1" for namespace in sorted(unlimited_namespaces())]
        assert sorted(retention) == sorted([*kept, f"tg/audit --size -1 --time {audit}"])
    token.write_text("")
    assert not any("--auth-params" in call for call in run(PULSAR_ADMIN_TOKEN_FILE=str(token))), (
        "an empty token file means no auth"
    )
    research = run(TOOLREG_TOPICSPACE="research")  # the topicspace toolreg's processes are given, not always tg
    assert "--admin-url http://broker:8080 tenants create research --allowed-clusters standalone" in research
    assert {call.split()[-1] for call in research if " namespaces create " in call} == {
        namespace.replace("tg/", "research/") for namespace in init_script_layout()[1]
    }


def test_the_init_script_grants_each_kind_what_the_run_broker_grants_it(tmp_path: Path) -> None:
    """deploy/pulsar-init.sh and scripts/apache_pulsar.py (`grant_kinds`, what the Apache Pulsar tests run under)
    grant each kind of process the same actions, and reserve the same subscriptions for the store's role."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "pulsar-admin"
    fake.write_text(FAKE_ADMIN)
    fake.chmod(0o755)
    roles = {kind: f"role-{kind}" for kind in KIND_GRANTS}
    env = {"PATH": os.environ["PATH"], "PULSAR_HOME": str(tmp_path), "STATE": str(tmp_path)}
    env.update({f"TOOLREG_{kind.upper()}_ROLE": role for kind, role in roles.items()})
    result = subprocess.run(["sh", str(DEPLOY / "pulsar-init.sh")], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    granted: dict[str, dict[str, tuple[str, ...]]] = {}
    for call in calls:
        words = call.split()
        if "grant-permission" in words:
            namespace, role, actions = words[words.index("grant-permission") + 1], words[-3], words[-1]
            kind = next(k for k, r in roles.items() if r == role)
            granted.setdefault(kind, {})[namespace.split("/")[1]] = tuple(actions.split(","))
    assert granted == KIND_GRANTS
    reserved = [call.split()[-5:] for call in calls if "grant-subscription-permission" in call]
    assert reserved == [
        ["tg/request", "--subscription", subscription, "--roles", roles["store"]]
        for subscription in RESERVED_SUBSCRIPTIONS
    ]


def test_the_init_script_grants_each_service_its_own_queues_as_toolreg_grant_does(tmp_path: Path) -> None:
    """TOOLREG_SERVICE_GRANTS: each service's role gets topic-level grants on its own queues (as `toolreg grant
    service`), and TOOLREG_SERVICE_ROLE keeps only discovery (as `toolreg init --per-service`)."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "pulsar-admin"
    fake.write_text(FAKE_ADMIN)
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "PULSAR_HOME": str(tmp_path), "STATE": str(tmp_path)}
    env.update(TOOLREG_SERVICE_ROLE="shared", TOOLREG_SERVICE_GRANTS="joke-service=jokes maps=maps-team")
    result = subprocess.run(["sh", str(DEPLOY / "pulsar-init.sh")], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    namespaces = {tuple(c.split()[-5:]) for c in calls if " namespaces grant-permission " in c}
    assert namespaces == {
        ("tg/discovery", "--role", role, "--actions", "produce,consume") for role in ("shared", "jokes", "maps-team")
    }
    revoked = {tuple(c.split()[-3:]) for c in calls if " namespaces revoke-permission " in c}
    assert revoked == {("tg/request", "--role", "shared"), ("tg/response", "--role", "shared")}
    topics = [c.split()[-5:] for c in calls if " topics grant-permission " in c]
    expected = [
        [f"non-persistent://tg/{queue}", "--role", role, "--actions", action]
        for service, role in (("joke-service", "jokes"), ("maps", "maps-team"))
        for queue, action in (
            (f"request/{service}", "consume"),
            (f"request/{service}.cancel", "consume"),
            (f"response/{service}", "produce"),
        )
    ]
    assert topics == expected
    created = [c.split()[-1] for c in calls if " topics create " in c]
    assert created == [grant[0] for grant in expected], "each queue made before it is granted"
    env.update(TOOLREG_SERVICE_GRANTS="config=evil")
    refused = subprocess.run(["sh", str(DEPLOY / "pulsar-init.sh")], env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "not SERVICE-ID=ROLE for a tool service" in refused.stderr


def test_the_shell_scripts_parse() -> None:
    for script in ("pulsar-init.sh", "pulsar-secrets.sh"):
        result = subprocess.run(["sh", "-n", str(DEPLOY / script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"


# --- token authentication ---------------------------------------------------------------


KIND_OF = {"registry": "store", "joke": "service", "calculator": "service", "bridge": "agent"}
"""The kind of process each compose service is, so the role (and token) it runs with (docs/operators.md, "Roles")."""
K8S_SECRET_OF = {"store": "toolreg-store-token", "service": "toolreg-service-token", "agent": "toolreg-agent-token"}


def test_the_token_variant_gives_each_kind_of_process_its_own_role_and_turns_auth_on_in_the_broker() -> None:
    spec = compose("auth")
    services = compose_toolreg_services(spec)
    assert set(services) - {"group-key"} == set(KIND_OF)
    for name, kind in KIND_OF.items():
        service = services[name]
        path = service["environment"]["PULSAR_AUTH_TOKEN_FILE"]
        mounts = {v.split(":")[1]: v for v in service.get("volumes", [])}
        assert mounts[str(Path(path).parent)].startswith(f"toolreg-{kind}-token:"), name
        others = [v for v in service.get("volumes", []) if "-token:" in v and not v.startswith(f"toolreg-{kind}-")]
        assert others == [], f"{name} can read another kind's token: {others}"
    secrets = spec["services"]["pulsar-secrets"]
    for kind in ("store", "service", "agent", "operator"):
        assert f"toolreg-{kind}-token:/toolreg-tokens/{kind}" in secrets["volumes"], kind
    assert "/toolreg-tokens/$kind/token" in (DEPLOY / "pulsar-secrets.sh").read_text()

    pulsar = spec["services"]["pulsar"]
    env = pulsar["environment"]
    prefix = "PULSAR_PREFIX_"  # applied to conf/standalone.conf by apply-config-from-env.py in the broker's command
    assert env[prefix + "authenticationEnabled"] == "true" and env[prefix + "authorizationEnabled"] == "true"
    assert (
        env[prefix + "authenticationProviders"] == "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
    )
    assert env[prefix + "brokerClientAuthenticationPlugin"] == "org.apache.pulsar.client.impl.auth.AuthenticationToken"
    for key in ("tokenSecretKey", "brokerClientAuthenticationParameters"):
        path = env[prefix + key].removeprefix("file://")
        assert any(v.endswith(":ro") and v.split(":")[1] == str(Path(path).parent) for v in pulsar["volumes"]), key
    assert env[prefix + "superUserRoles"] == "admin"
    assert "--auth-params" in pulsar["healthcheck"]["test"] and pulsar["healthcheck"]["test"][-2:] == [
        "brokers",
        "healthcheck",
    ]
    assert pulsar["depends_on"]["pulsar-secrets"] == {"condition": "service_completed_successfully"}
    init = spec["services"]["pulsar-init"]["environment"]
    assert init["PULSAR_ADMIN_TOKEN_FILE"] == env[prefix + "brokerClientAuthenticationParameters"].removeprefix(
        "file://"
    )
    assert {kind: init[f"TOOLREG_{kind.upper()}_ROLE"] for kind in ("store", "service", "agent", "operator")} == {
        kind: f"toolreg-{kind}" for kind in ("store", "service", "agent", "operator")
    }, "each role is the subject of the token pulsar-secrets makes for that kind"

    for where, pod, container in toolreg_containers():
        token = k8s_env(container)["PULSAR_AUTH_TOKEN_FILE"]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(Path(token).parent))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        kind = KIND_OF.get(where.split("/")[1].removeprefix("toolreg-"), "agent")  # the smoke Job is an agent
        assert volume["secret"]["secretName"] == K8S_SECRET_OF[kind], where
    for secret in K8S_SECRET_OF.values():
        assert set(k8s_find("Secret", secret)["stringData"]) == {Path(token).name}
    job = k8s_find("Job", "toolreg-pulsar-init")["spec"]["template"]["spec"]["containers"][0]
    roles = {f"TOOLREG_{kind.upper()}_ROLE" for kind in ("store", "service", "agent", "operator")}
    assert roles <= {item["name"] for item in job["env"]}


def test_the_image_builds_from_exactly_what_it_copies(tmp_path: Path) -> None:
    """Mirror `COPY ...` + `pip install .` without an engine or a download: copy what the
    Containerfile copies, build an sdist from that alone, then import every module from it."""
    sources = [part for instruction, args in containerfile() if instruction == "COPY" for part in args.split()[:-1]]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(p.rstrip("*") for p in include) == sorted(PACKAGES)
    assert set(sources) == {
        "pyproject.toml",
        project["project"]["readme"],
        *project["project"]["license-files"],
        *PACKAGES,
    }
    ignore = (DEPLOY / "Containerfile.dockerignore").read_text()
    for source in sources:
        assert f"!{source}" in ignore or f"!{source}/**" in ignore, f"{source} is filtered out of the build context"
    work = tmp_path / "src"
    work.mkdir()
    for source in sources:
        (shutil.copytree if (ROOT / source).is_dir() else shutil.copy)(ROOT / source, work / source)
    out = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-c", f"import setuptools.build_meta as b; print(b.build_sdist({str(out)!r}))"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    with tarfile.open(out / build.stdout.strip().splitlines()[-1]) as sdist:
        names = sdist.getnames()
        entry_points = next(n for n in names if n.endswith(".egg-info/entry_points.txt"))
        assert "toolreg = discovery.cli:main" in sdist.extractfile(entry_points).read().decode()  # type: ignore[union-attr]
    for module in (
        "discovery/web/health.py",
        "discovery/cli/main.py",
        "discovery/web/static/page.js",
        "toolservice_base/metrics.py",
        "agent_bridge/__init__.py",
    ):
        assert any(n.endswith(module) for n in names), module
    probe = (
        f"import importlib, pkgutil, sys\npackages = {PACKAGES!r}\nfor name in packages:\n    package ="
        " importlib.import_module(name)\n    for info in pkgutil.walk_packages(package.__path__, name + '.'):\n       "
        " importlib.import_module(info.name)\noutside = [m for n, m in sys.modules.items() if n.split('.')[0] in"
        " packages and not m.__file__.startswith(sys.argv[1])]\nassert not outside, outside\nfrom discovery.cli.main"
        " import build_parser; build_parser()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(work)], cwd=work, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


# --- the client scripts, for real ------------------------------------------------------------


def script_of(service: dict[str, Any]) -> str:
    command = service.get("args") or service["command"]
    return command[0] if isinstance(command, list) else command


def run_env(broker: EmbeddedBroker, data_dir: Path) -> dict[str, str]:
    env = toolreg_env(broker.url, data_dir)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `toolreg` = this venv's script
    return env


@pytest.fixture
def running_stack(broker: EmbeddedBroker, tmp_path: Path) -> Any:
    """`toolreg up` and the two example services, as the deploy files run them, on a real broker."""
    env = toolreg_env(broker.url, tmp_path / "registry")
    commands = [compose()["services"][name]["command"] for name in ("registry", "joke", "calculator")]
    procs = [toolreg_background(*argv, env=env, log=tmp_path / f"{argv[0]}-{i}.log") for i, argv in enumerate(commands)]
    yield
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=20)


def test_the_k8s_smoke_job_lists_and_calls_the_tools(
    running_stack: Any, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    container = k8s_find("Job", "toolreg-smoke")["spec"]["template"]["spec"]["containers"][0]
    result = subprocess.run(
        [*container["command"], script_of(container)],
        env=run_env(broker, tmp_path / "smoke"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tell-joke" in result.stdout and "calculate" in result.stdout
    assert "pun" in result.stdout and "\n20\n" in result.stdout, result.stdout


def test_the_compose_bridge_lists_and_calls_the_tools(
    running_stack: Any, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bridge = compose()["services"]["bridge"]
    log = tmp_path / "bridge.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*bridge["entrypoint"], script_of(bridge)],
            env=run_env(broker, tmp_path / "bridge"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = 90.0
        while deadline > 0 and "\n20\n" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.5)
            deadline -= 0.5
        text = log.read_text()
        assert "tell-joke" in text and "pun" in text and "\n20\n" in text, text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


# --- the operator documentation -----------------------------------------------------------


def test_operator_docs_cover_every_setting_metric_and_topic() -> None:
    from prometheus_client import CollectorRegistry

    from agent_bridge.metrics import BridgeMetrics
    from discovery.registry.metrics import RegistryMetrics
    from discovery.store.metrics import ConfigStoreMetrics
    from toolservice_base.metrics import ServiceMetrics

    docs = (ROOT / "docs" / "operators.md").read_text()
    missing = [var for var in sorted(env_vars_read_by_the_package()) if f"`{var}`" not in docs]
    assert not missing, f"docs/operators.md does not describe {missing}"
    registry = CollectorRegistry()
    for metrics in (RegistryMetrics, ConfigStoreMetrics, ServiceMetrics, BridgeMetrics):
        metrics(registry)
    names = {family.name + ("_total" if family.type == "counter" else "") for family in registry.collect()}
    assert len(names) == 20  # every family the four metric classes register
    assert not [name for name in sorted(names) if f"`{name}`" not in docs], "a metric is not documented"
    for name, value in vars(topics).items():
        if name.isupper() and isinstance(value, str):
            assert f"`{value}`" in docs, f"topic {value} is not documented"
    for name in dir(topics.Topics):
        uri = getattr(topics.DEFAULT, name) if isinstance(getattr(topics.Topics, name), property) else None
        if isinstance(uri, str) and "://" in uri:
            assert f"`{uri}`" in docs, f"topic {uri} ({name}) is not in the topics table"
    # every option of the long-running commands an operator starts, and of `toolreg replicas`
    subcommands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for command in ("up", "registry", "replicas"):
        flags = {
            o for a in subcommands[command]._actions for o in a.option_strings if o.startswith("--") and o != "--help"
        }
        missing = [f for f in sorted(flags) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", docs)]
        assert not missing, f"docs/operators.md does not mention `toolreg {command}`'s {missing}"
    readme = (ROOT / "README.md").read_text()
    assert "(docs/operators.md)" in readme and "(deploy/README.md)" in readme
    deploy_readme = (DEPLOY / "README.md").read_text()
    for path in re.findall(r"^\| `([^`]+)` \|", deploy_readme, re.M):
        assert (DEPLOY / path.rstrip("/")).exists(), f"deploy/README.md lists {path}, which does not exist"
