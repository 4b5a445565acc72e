#!/bin/sh
# Token authentication for the compose variant (compose.auth.yaml): made once, kept in volumes.
#
#   /pulsar/secrets/secret.key        HMAC key the broker validates tokens with   (broker only)
#   /pulsar/secrets/admin.token       superuser token: the broker's own client, the health check, pulsar-init
#   /toolreg-tokens/<kind>/token      a token per kind of process, each in a volume of its own, mounted only into
#                                     the containers of that kind: store (the registry), service (the tool
#                                     services), agent (the bridge); and operator, for `docker compose run`
#
# Runs as root in the apachepulsar/pulsar image, then hands each file to the uid that reads it:
# 10000 is the Pulsar image's user, 10001 the toolreg image's (deploy/Containerfile).
set -eu

KEY=/pulsar/secrets/secret.key
ADMIN=/pulsar/secrets/admin.token
PULSAR_BIN="${PULSAR_HOME:-/pulsar}/bin/pulsar"
umask 077

if [ ! -s "$KEY" ]; then
  "$PULSAR_BIN" tokens create-secret-key --output "$KEY"
  echo "created $KEY"
fi
if [ ! -s "$ADMIN" ]; then
  "$PULSAR_BIN" tokens create --secret-key "file://$KEY" --subject admin > "$ADMIN"
  echo "created $ADMIN (role admin)"
fi
for kind in store service agent operator; do
  token="/toolreg-tokens/$kind/token"
  if [ ! -s "$token" ]; then
    "$PULSAR_BIN" tokens create --secret-key "file://$KEY" --subject "toolreg-$kind" > "$token"
    echo "created $token (role toolreg-$kind)"
  fi
  chown 10001:0 "$token"
  chmod 0440 "$token"
done

chown 10000:0 "$KEY" "$ADMIN"
chmod 0440 "$KEY" "$ADMIN"
