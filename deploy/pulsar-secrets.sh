#!/bin/sh
# Token authentication for the compose variant (compose.auth.yaml): made once, kept in volumes.
#
#   /pulsar/secrets/secret.key    HMAC key the broker validates tokens with   (broker only)
#   /pulsar/secrets/admin.token   superuser token: the broker's own client, the health check, pulsar-init
#   /toolreg-token/token          token of role "toolreg", mounted into every toolreg container
#
# Runs as root in the apachepulsar/pulsar image, then hands each file to the uid that reads it:
# 10000 is the Pulsar image's user, 10001 the toolreg image's (deploy/Containerfile).
set -eu

KEY=/pulsar/secrets/secret.key
ADMIN=/pulsar/secrets/admin.token
TOOLREG=/toolreg-token/token
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
if [ ! -s "$TOOLREG" ]; then
  "$PULSAR_BIN" tokens create --secret-key "file://$KEY" --subject toolreg > "$TOOLREG"
  echo "created $TOOLREG (role toolreg)"
fi

chown 10000:0 "$KEY" "$ADMIN"
chmod 0440 "$KEY" "$ADMIN"
chown 10001:0 "$TOOLREG"
chmod 0440 "$TOOLREG"
