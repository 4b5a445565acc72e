#!/bin/sh
# Create the tenant and namespaces toolreg uses on an Apache Pulsar cluster, and grant each kind of process
# its own role (with authorization on). Safe to run again.
#
# Runs in the apachepulsar/pulsar image (it needs bin/pulsar-admin). Settings, all optional:
#   PULSAR_ADMIN_URL         the broker's admin (HTTP) URL         default http://localhost:8080
#   PULSAR_CLUSTER           the cluster the tenant may use        default standalone
#   PULSAR_ADMIN_TOKEN_FILE  a superuser token, if auth is on      default: no auth (also when the file is empty)
#   TOOLREG_AUDIT_RETENTION  how long tg/audit keeps the MCP front's audit records    default 30d
#   TOOLREG_TOPICSPACE       the tenant to prepare, as toolreg's processes name it  default tg
# and, with authorization on, a role per kind of process (docs/operators.md, "Roles"):
#   TOOLREG_STORE_ROLE       the config store's replicas and the registry (toolreg up, toolreg registry): all six
#                            namespaces; the only role that may produce on state, and use the config-store and
#                            tool-registry subscriptions
#   TOOLREG_SERVICE_ROLE     tool services (toolreg serve, toolreg announce): consume requests, produce responses,
#                            announce and hear probes
#   TOOLREG_SERVICE_GRANTS   instead, each service its own queues (`toolreg init --per-service` and `toolreg grant
#                            service`): SERVICE-ID=ROLE pairs, space-separated; each role may consume only that
#                            service's request (and cancel) queue and produce only on its response queue, and
#                            TOOLREG_SERVICE_ROLE keeps only discovery
#   TOOLREG_AGENT_ROLE       agents and MCP fronts (a ToolSet, toolreg mcp, toolreg call): send requests, read
#                            responses and config pushes, publish audit records
#   TOOLREG_OPERATOR_ROLE    operators (toolreg config, tools, replicas, store export): an agent's rights but
#                            publishing audit records, and read the state and audit topics
#   TOOLREG_ROLE             one role for every kind at once (no least privilege: what this script granted before
#                            the kinds had roles of their own)
# `toolreg init [--topicspace T] [--admin-url U] [--store-role R ...]` does the same where toolreg is installed.
#
# Every toolreg topic is non-persistent://<topicspace>/<namespace>/<name>; shared subscriptions also open
# throwaway consumers on non-persistent://<topicspace>/request/consumer-id-shift, in the request namespace.
# The exception is <topicspace>/state: the replicated config store (--store pulsar) keeps its log, snapshots
# and locks there, in persistent topics that must be kept without limit (retention -1/-1, set on every run).
# And <topicspace>/audit: toolreg mcp --audit-topic records every call there, kept for TOOLREG_AUDIT_RETENTION
# (default 30d; a pulsar-admin time such as 90d or 1y).
set -eu

ADMIN_URL="${PULSAR_ADMIN_URL:-http://localhost:8080}"
CLUSTER="${PULSAR_CLUSTER:-standalone}"
TENANT="${TOOLREG_TOPICSPACE:-tg}"
NAMESPACES="request response notify discovery state audit"
UNLIMITED="state"
AUDIT_RETENTION="${TOOLREG_AUDIT_RETENTION:-30d}"
RESERVED="config-store tool-registry"
ADMIN_BIN="${PULSAR_HOME:-/pulsar}/bin/pulsar-admin"

admin() {
  if [ -n "${PULSAR_ADMIN_TOKEN_FILE:-}" ] && [ -s "$PULSAR_ADMIN_TOKEN_FILE" ]; then
    "$ADMIN_BIN" --admin-url "$ADMIN_URL" \
      --auth-plugin org.apache.pulsar.client.impl.auth.AuthenticationToken \
      --auth-params "file://$PULSAR_ADMIN_TOKEN_FILE" "$@"
  else
    "$ADMIN_BIN" --admin-url "$ADMIN_URL" "$@"
  fi
}

# What each kind of process may do on each namespace (nothing where nothing is printed).
actions() {
  case "$1/$2" in
    store/*) echo produce,consume ;;
    service/request) [ -z "${TOOLREG_SERVICE_GRANTS:-}" ] && echo consume || echo "" ;;
    service/response) [ -z "${TOOLREG_SERVICE_GRANTS:-}" ] && echo produce || echo "" ;;
    service/discovery) echo produce,consume ;;
    agent/request | operator/request) echo produce ;;
    agent/response | operator/response) echo produce,consume ;;
    agent/notify | operator/notify) echo consume ;;
    agent/audit) echo produce ;;
    operator/state | operator/audit) echo consume ;;
    *) echo "" ;;
  esac
}

role_of() {
  case "$1" in
    store) echo "${TOOLREG_STORE_ROLE:-}" ;;
    service) echo "${TOOLREG_SERVICE_ROLE:-}" ;;
    agent) echo "${TOOLREG_AGENT_ROLE:-}" ;;
    operator) echo "${TOOLREG_OPERATOR_ROLE:-}" ;;
  esac
}

if admin tenants get "$TENANT" >/dev/null 2>&1; then
  echo "tenant $TENANT: exists"
else
  admin tenants create "$TENANT" --allowed-clusters "$CLUSTER"
  echo "tenant $TENANT: created (cluster $CLUSTER)"
fi

existing="$(admin namespaces list "$TENANT")"
for name in $NAMESPACES; do
  namespace="$TENANT/$name"
  if printf '%s\n' "$existing" | grep -qx "$namespace"; then
    echo "namespace $namespace: exists"
  else
    admin namespaces create "$namespace"
    echo "namespace $namespace: created"
  fi
  case " $UNLIMITED " in
    *" $name "*)
      admin namespaces set-retention "$namespace" --size -1 --time -1
      echo "namespace $namespace: retention unlimited"
      ;;
  esac
  case "$name" in
    audit)
      admin namespaces set-retention "$namespace" --size -1 --time "$AUDIT_RETENTION"
      echo "namespace $namespace: retention $AUDIT_RETENTION"
      ;;
  esac
  if [ -n "${TOOLREG_ROLE:-}" ]; then
    admin namespaces grant-permission "$namespace" --role "$TOOLREG_ROLE" --actions produce,consume
    echo "namespace $namespace: role $TOOLREG_ROLE (every kind) may produce and consume"
  fi
  for kind in store service agent operator; do
    role="$(role_of "$kind")"
    allowed="$(actions "$kind" "$name")"
    if [ -n "$role" ] && [ -n "$allowed" ]; then
      admin namespaces grant-permission "$namespace" --role "$role" --actions "$allowed"
      echo "namespace $namespace: role $role ($kind) may $allowed"
    fi
  done
done

# Each service its own queues: topic-level grants. Apache Pulsar grants on a topic only while it exists, and a
# non-persistent topic exists only while in use, so each queue is made first (an existing one is kept); the grant
# is kept in the namespace's policy and holds when the topic is made again.
if [ -n "${TOOLREG_SERVICE_GRANTS:-}" ]; then
  if [ -n "${TOOLREG_SERVICE_ROLE:-}" ]; then
    for name in request response; do
      admin namespaces revoke-permission "$TENANT/$name" --role "$TOOLREG_SERVICE_ROLE" >/dev/null 2>&1 || true
      echo "namespace $TENANT/$name: role $TOOLREG_SERVICE_ROLE (service) may do nothing namespace-wide"
    done
  fi
  for pair in $TOOLREG_SERVICE_GRANTS; do
    service="${pair%%=*}"
    role="${pair#*=}"
    case "$service" in
      config | config:* | tool-registry | "" | *=*)
        echo "TOOLREG_SERVICE_GRANTS: '$pair' is not SERVICE-ID=ROLE for a tool service" >&2
        exit 1
        ;;
    esac
    for grant in "request/$service consume" "request/$service.cancel consume" "response/$service produce"; do
      topic="non-persistent://$TENANT/${grant% *}"
      admin topics create "$topic" >/dev/null 2>&1 || true
      admin topics grant-permission "$topic" --role "$role" --actions "${grant##* }"
      echo "topic $topic: role $role (service $service) may ${grant##* }"
    done
    admin namespaces grant-permission "$TENANT/discovery" --role "$role" --actions produce,consume
    echo "namespace $TENANT/discovery: role $role (service $service) may produce,consume"
  done
fi

# Only the store's role may consume through the store's and the registry's own subscriptions: another role
# allowed to consume requests (a tool service's) could otherwise join them and swallow config requests.
store_roles="$(printf '%s' "${TOOLREG_STORE_ROLE:-},${TOOLREG_ROLE:-}" | sed 's/^,//; s/,$//')"
if [ -n "$store_roles" ]; then
  for subscription in $RESERVED; do
    admin namespaces grant-subscription-permission "$TENANT/request" --subscription "$subscription" \
      --roles "$store_roles"
    echo "namespace $TENANT/request: subscription $subscription only for role(s) $store_roles"
  done
fi
echo "toolreg namespaces ready on $ADMIN_URL"
