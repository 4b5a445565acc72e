#!/bin/sh
# Create the tenant and namespaces toolreg uses on an Apache Pulsar cluster. Safe to run again.
#
# Runs in the apachepulsar/pulsar image (it needs bin/pulsar-admin). Settings, all optional:
#   PULSAR_ADMIN_URL         the broker's admin (HTTP) URL         default http://localhost:8080
#   PULSAR_CLUSTER           the cluster the tenant may use        default standalone
#   PULSAR_ADMIN_TOKEN_FILE  a superuser token, if auth is on      default: no auth (also when the file is empty)
#   TOOLREG_ROLE             role to grant produce+consume on the namespaces (with authorization on)
#   TOOLREG_AUDIT_RETENTION  how long tg/audit keeps the MCP front's audit records    default 30d
#   TOOLREG_TOPICSPACE       the tenant to prepare, as toolreg's processes name it  default tg
# `toolreg init [--topicspace T] [--admin-url U] [--role R]` does the same where toolreg is installed.
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
    audit)
      admin namespaces set-retention "$namespace" --size -1 --time "$AUDIT_RETENTION"
      echo "namespace $namespace: retention $AUDIT_RETENTION"
      ;;
  esac
  if [ -n "${TOOLREG_ROLE:-}" ]; then
    admin namespaces grant-permission "$namespace" --role "$TOOLREG_ROLE" --actions produce,consume
    echo "namespace $namespace: role $TOOLREG_ROLE may produce and consume"
  fi
done
echo "toolreg namespaces ready on $ADMIN_URL"
