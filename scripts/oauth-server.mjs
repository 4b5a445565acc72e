// An OAuth 2.1 authorization server for tests: panva's oidc-provider (OpenID Certified), configured from a JSON file.
//
//   OIDC_PROVIDER_HOME=<dir with node_modules/oidc-provider> node oauth-server.mjs CONFIG.json
//
// CONFIG: {"issuer": "http://127.0.0.1:PORT", "port": PORT, "jwks": {"keys": [private JWKs]} (none: a fresh RSA key),
//          "clients": [oidc-provider client metadata], "grants": {client_id: "scopes it may get at any resource"},
//          "claims": {client_id: {extra access-token claims}}, "ttl": {client_id: seconds},
//          "opaque": [client ids whose access tokens are opaque (introspection only)]}
// Client credentials grant, resource indicators (RFC 8707: the token's audience is the resource asked for) and
// introspection (RFC 7662) are on. Prints "ready <issuer>" once listening; SIGTERM stops it.
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const home = process.env.OIDC_PROVIDER_HOME;
const { default: Provider } = await import(pathToFileURL(join(home, 'node_modules', 'oidc-provider', 'lib', 'index.js')));

const jwks = config.jwks ?? {
  keys: [{ ...generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' }),
    kid: 'local', alg: 'RS256', use: 'sig' }],
};
const grants = config.grants ?? {};
const claims = config.claims ?? {};
const ttl = config.ttl ?? {};
const opaque = new Set(config.opaque ?? []);

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks,
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource, client) => ({
        scope: grants[client.clientId] ?? '',
        audience: resource,
        accessTokenTTL: ttl[client.clientId] ?? 300,
        accessTokenFormat: opaque.has(client.clientId) ? 'opaque' : 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  extraTokenClaims: (ctx, token) => claims[token.clientId],
});

const server = provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`ready ${config.issuer}\n`);
});
const stop = () => server.close(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
